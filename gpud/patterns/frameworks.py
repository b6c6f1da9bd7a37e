"""Metrics from the output of the frameworks people use, with no pattern in the spec
(issue 32 §2): `metrics: auto`, what a spec without `metrics:` patterns gets.

A script that knows nothing of gpud still prints its progress the way its framework does.
Steps are gpud's (from 0): a framework that counts from 1 (a bar's count, torchtitan's
`step: 10`, DeepSpeed's `steps: 10`) has its number less one, so every view, which shows
steps done, shows the framework's own number; nanoGPT's `iter N` is already from 0.
Each recognizer reads one framework's lines; the first to find a metric names the run's
output (`Recognizers.matched`, said once in the run's events):

- `hf-trainer`: Hugging Face `Trainer`'s logged dicts (`{'loss': '6.157', 'grad_norm':
  …, 'learning_rate': …, 'epoch': …}`, numbers or quoted numbers), at the step of its
  progress bar (`10/400 [00:08<05:12,  1.25it/s]`) (not the end's summary, whose
  `train_loss` is the whole run's mean);
- `lightning`: Lightning's progress bar, `Epoch 1:  25%|…| 10/40 [00:01<00:03,
  8.12it/s, v_num=0, train_loss=2.31]`: the global step (epoch × batches + batch) and
  the postfix's numbers, `self.log(..., prog_bar=True)`'s among them; its rich bar
  (`Epoch 0/-2 ━━━ 20/40 0:00:01 • 0:00:02 15.14it/s train_loss: 5.721`) alike, which
  rich draws, where output is not a terminal, only once the bar ends;
- `nanogpt`: `iter 120: loss 2.3121, time 41.23ms, mfu 34.53%`;
- `torchtitan`: `step: 10  loss:  8.1234  memory: …  tps: 1,234  tflops: 56.78  mfu:
  12.3%` (its colour codes taken off);
- `deepspeed`: the engine's `steps: 10 loss: 1.23 iter time (s): 0.51 samples/sec: 62.7`;
- `tqdm`: any other progress bar (an accelerate script's, a plain loop's): its count is
  the step, its rate `steps_per_s`.

tqdm redraws a bar with `\\r`, not a new line: each `\\r`-separated update is read as a
line of its own. The first bar seen is the training bar; bars of another length
(evaluation, a dataloader's) are not steps. Our own fixed expressions on short lines
(cut at MAX_LINE): no user input reaches them, so no budget is needed (the spec's own
patterns run on RE2 with one: `gpud.patterns.extract`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from gpud.patterns.extract import Disabled

#: The part of a line (or of one `\r` update) the recognizers look at.
MAX_LINE = 4096
_NUMBER = r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
#: tqdm's bar: `n/total [elapsed<remaining, rate it/s` (or `s/it`), then the postfix.
_BAR = re.compile(
    r"(?P<n>\d+)/(?P<total>\d+) \[[\d:]+<[\d:?]+,\s*(?P<rate>[\d.]+|\?)(?P<unit>it/s|s/it)"
    r"(?P<postfix>[^\]]*)\]"
)
#: rich's bar (Lightning's when `rich` is installed): `n/total elapsed • remaining rate`,
#: then `key: value` pairs.
_RICH_BAR = re.compile(
    r"(?P<n>\d+)/(?P<total>\d+) [\d:]+ • [\d:-]+ (?P<rate>[\d.]+|\?)(?P<unit>it/s|s/it)"
    r"(?P<postfix>.*)$"
)
_EPOCH = re.compile(r"^Epoch (?P<epoch>\d+)(?::|/-?\d+ )")
_POSTFIX = re.compile(rf"(?P<key>[A-Za-z_][\w/.]*)=(?P<value>{_NUMBER})\b")
_RICH_POSTFIX = re.compile(rf"(?P<key>[A-Za-z_][\w/.]*): (?P<value>{_NUMBER})\b")
_HF_DICT = re.compile(r"^\{'[a-z_]+': ")
_HF_PAIR = re.compile(rf"'(?P<key>[a-z_]+)': '?(?P<value>{_NUMBER})'?")
_NANOGPT = re.compile(
    rf"^iter (?P<step>\d+): loss (?P<loss>{_NUMBER}), time (?P<step_time_ms>{_NUMBER})ms"
    rf"(?:, mfu (?P<script_mfu_pct>{_NUMBER})%)?"
)
_TITAN = re.compile(rf"step:\s*(?P<step>\d+)\s+loss:\s*(?P<loss>{_NUMBER})")
_TITAN_MORE = re.compile(r"(?P<key>tps|tflops|mfu):\s*(?P<value>[\d,]+(?:\.\d+)?)%?")
_DEEPSPEED = re.compile(
    rf"steps: (?P<step>\d+) loss: (?P<loss>{_NUMBER}) iter time \(s\): (?P<step_time_s>"
    rf"{_NUMBER}) samples/sec: (?P<samples_per_s>{_NUMBER})"
)
#: A progress bar's postfix keys that are not metrics.
_NOT_METRICS = frozenset({"v_num"})
#: What the frameworks call a metric, as gpud's views name it.
_RENAMED = {"learning_rate": "lr", "train_loss": "loss", "tps": "tokens_per_s_per_gpu",
            "mfu": "script_mfu_pct"}  # fmt: skip

Reading = tuple[int | None, dict[str, float]]


def _numbers(pairs: Iterator[re.Match[str]]) -> dict[str, float]:
    values: dict[str, float] = {}
    for pair in pairs:
        key = pair["key"]
        if key in _NOT_METRICS:
            continue
        try:
            values[_RENAMED.get(key, key)] = float(pair["value"].replace(",", ""))
        except ValueError:
            continue
    return values


@dataclass
class _Bar:
    """The training bar: the first bar's length, and the step it last showed."""

    total: int | None = None
    step: int | None = None


def _read_bar(text: str, bar: _Bar, global_step: Callable[[int, int], int]) -> Reading | None:
    postfix = _POSTFIX
    found = _BAR.search(text)
    if found is None:
        found, postfix = _RICH_BAR.search(text), _RICH_POSTFIX
    if found is None:
        return None
    total = int(found["total"])
    if bar.total is None:
        bar.total = total
    if total != bar.total:
        return None, {}  # another bar (evaluation, a dataloader's): not a step
    done = global_step(int(found["n"]), total)  # steps done: 1 for the first
    if done < 1:
        return None, {}
    bar.step = done - 1  # gpud counts steps from 0, as the trainers library does
    values = _numbers(postfix.finditer(found["postfix"]))
    if found["rate"] != "?":
        rate = float(found["rate"])
        if rate > 0:
            values["steps_per_s"] = rate if found["unit"] == "it/s" else 1 / rate
    return bar.step, values


@dataclass
class Recognizers:
    """`metrics: auto`: the frameworks' lines, read as `MetricExtractor` reads patterns
    (`extract()` a line, `take_disabled()` never has anything)."""

    #: The recognizer that found the run's metrics (a framework's own over the bare
    #: `tqdm` that its progress bar also matches).
    matched: str | None = None
    _bar: _Bar = field(default_factory=_Bar)

    def __bool__(self) -> bool:
        return True

    def take_disabled(self) -> list[Disabled]:
        return []

    def extract(self, text: str) -> Reading:
        """(step, values) from one line, each of its `\\r` updates read in turn: the last
        update with a step wins, and its values."""
        step: int | None = None
        values: dict[str, float] = {}
        for part in text.split("\r"):
            found, name = self._one(_ANSI.sub("", part[:MAX_LINE]).strip())
            if found is None or found[0] is None or not found[1]:
                continue
            step, values = found
            if self.matched in (None, "tqdm"):  # a framework's own lines name it better
                self.matched = name
        return step, values

    def _one(self, line: str) -> tuple[Reading | None, str]:
        if not line:
            return None, ""
        if (hit := _NANOGPT.search(line)) is not None:
            return _groups(hit), "nanogpt"
        if (hit := _DEEPSPEED.search(line)) is not None:
            return _groups(hit, counted=True), "deepspeed"
        if (hit := _TITAN.search(line)) is not None:
            step, values = _groups(hit, counted=True)
            values.update(_numbers(_TITAN_MORE.finditer(line[hit.end() :])))
            return (step, values), "torchtitan"
        if _HF_DICT.match(line):
            if "'train_runtime'" in line:  # the end's summary: its train_loss is the mean
                return None, ""
            values = _numbers(_HF_PAIR.finditer(line))
            return (self._bar.step, values), "hf-trainer"
        if (epoch := _EPOCH.match(line)) is not None:
            at = int(epoch["epoch"])
            return _read_bar(line, self._bar, lambda n, total: at * total + n), "lightning"
        return _read_bar(line, self._bar, lambda n, _: n), "tqdm"


def _groups(hit: re.Match[str], counted: bool = False) -> Reading:
    """The match's step and numbers; `counted`: the framework counts steps from 1 (its
    step 10 is gpud's 9, shown as 10 done, as nanoGPT's `iter 9` is)."""
    values = {k: float(v) for k, v in hit.groupdict().items() if v is not None and k != "step"}
    step = int(hit["step"]) - (1 if counted else 0)
    return (step if step >= 0 else None), values


__all__ = ["MAX_LINE", "Recognizers"]
