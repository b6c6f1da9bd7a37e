"""Installing gpud into a training environment never changes its torch (issue 11): a fresh
venv holds a torch that is not the one the README's commands ask for (a stand-in wheel
with a CUDA-style version), then gets gpud with its `train` extra, from this checkout,
by pip as a user runs it."""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from gpud import __version__

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parents[2]
THEIR_TORCH = "2.5.1+cu124"
MARK = "a training environment's own torch"


def wheel(folder: Path, name: str, version: str, files: dict[str, str]) -> Path:
    """A pure-Python wheel, written by hand (PEP 427): what pip installs it as is all
    that matters here."""
    info = f"{name}-{version}.dist-info"
    files = {
        **files,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: gpud-tests\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{info}/RECORD,,")
    out = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(out, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
        z.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return out


def test_installing_gpud_with_its_train_extra_leaves_the_environments_torch_alone(
    tmp_path: Path,
) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"

    def pip(*args: str) -> str:
        done = subprocess.run(
            [str(python), "-m", "pip", "install", "--disable-pip-version-check", *args],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done.stdout

    theirs = wheel(
        tmp_path, "torch", THEIR_TORCH,
        {"torch/__init__.py": f"__version__ = {THEIR_TORCH!r}\nMARK = {MARK!r}\n"},
    )  # fmt: skip
    pip(str(theirs))
    pip(f"{ROOT}[train]")

    def ask(code: str) -> str:
        done = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert ask("import importlib.metadata as m; print(m.version('torch'))") == THEIR_TORCH
    assert ask("import torch; print(torch.MARK)") == MARK
    # What was asked for came, and what only the web UI needs did not.
    installed = ask(
        "import importlib.metadata as m; print(' '.join(sorted("
        "d.metadata['Name'].lower() for d in m.distributions())))"
    ).split()
    assert {"gpud", "accelerate", "wandb", "pyzmq"} <= set(installed)
    assert not {"textual-serve", "textual-plotext", "aiohttp", "deepspeed"} & set(installed)
    version = subprocess.run(
        [str(venv / "bin" / "gpuctl"), "--version"], capture_output=True, text=True
    )
    assert version.returncode == 0 and "(gpud)" in version.stdout
    # One version: the package's metadata is gpud.__version__ (pyproject reads it).
    assert ask("import importlib.metadata as m; print(m.version('gpud'))") == __version__
    assert __version__ in version.stdout
