"""Training scripts as their frameworks' users write them, knowing nothing of gpud: a tiny
randomly initialized model built from a config, synthetic data, nothing downloaded. The
callback tests add the one line `trainers.callbacks` documents (`with_callback`)."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).parent
#: The line a script makes its callbacks on, and what the callback's users write there.
CALLBACKS_LINE = "callbacks: list[Any] = []  # the Trainer's callbacks"
RESUME_LINE = "resume = args.resume or None  # what training starts from"
WITH_CALLBACK = {
    "hf": (
        "from trainers.callbacks.hf import GpudCallback\ncallbacks = [GpudCallback()]",
        "import trainers\nresume = trainers.init().resume_from",
    ),
    "lightning": (
        "from trainers.callbacks.lightning import GpudCallback\ncallbacks = [GpudCallback()]",
        "import trainers\nresume = trainers.init().resume_from",
    ),
}


def script(kind: str) -> str:
    """The plain script's text (`hf` or `lightning`)."""
    return (HERE / f"{kind}_plain.py").read_text()


def with_callback(kind: str) -> str:
    """The same script with gpud's callback, and gpud's checkpoint to resume from."""
    callbacks, resume = WITH_CALLBACK[kind]
    text = script(kind)
    assert CALLBACKS_LINE in text and RESUME_LINE in text
    return text.replace(CALLBACKS_LINE, callbacks).replace(RESUME_LINE, resume)
