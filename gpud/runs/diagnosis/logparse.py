"""Reading trainer output: rank prefixes, NCCL trouble, torchrun's verdict.

(The spec's metric patterns run on RE2 with a budget: `gpud.patterns`.)

Pure functions over text, so they are cheap to test against real log lines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpud.model.snapshot import Severity

#: torchrun --tee prefixes every worker line with `[<role><local_rank>]:` (the role is
#: `default` unless `--role` names another; never `rank`, which is torch's own, below).
RANK_PREFIX = re.compile(r"^\[(?!rank\d)(?P<role>[A-Za-z_]*?)(?P<local>\d+)\]:")
#: torch.distributed's excepthook (installed by `init_process_group`) prefixes each line of
#: an uncaught exception's report with `[rank<global rank>]: `, inside torchrun's prefix:
#: `[default1]:[rank1]: Traceback (most recent call last):`.
EXCEPTHOOK_PREFIX = re.compile(r"^\[rank(?P<rank>\d+)\]: ?")


#: torchrun's prefix in the middle of a line: where one of its writes began. torchrun
#: reads a worker's file in text mode, so a progress bar's `\r` ends a line there, and
#: a line still being written is copied as far as it goes, prefixed, and its rest later,
#: prefixed again: `[default0]: 10%|█| 2/20 [00:00<00:00][default0]:{'loss': …}`.
#: (A role of letters only: `x[0]:` in a worker's own text is not torchrun's.)
MID_LINE_PREFIX = re.compile(r"(?<=.)(?=\[(?!rank\d)[A-Za-z_]+\d+\]:)")


def torchrun_lines(lines: list[str]) -> list[str]:
    """The worker lines in torchrun's output: each line cut where torchrun's prefix begins
    a piece in its middle (an empty piece, the prefix alone, left out)."""
    out: list[str] = []
    for line in lines:
        if MID_LINE_PREFIX.search(line) is None:
            out.append(line)
            continue
        pieces = MID_LINE_PREFIX.split(line)
        out.append(pieces[0])
        out.extend(p for p in pieces[1:] if not RANK_PREFIX.fullmatch(p))
    return out


def rank_parts(line: str) -> tuple[int | None, int | None, str]:
    """(local rank from torchrun's prefix, global rank from torch's excepthook prefix,
    the text without either); None for a prefix the line does not have."""
    match = RANK_PREFIX.match(line)
    local = int(match["local"]) if match else None
    text = line[match.end() :] if match else line
    hook = EXCEPTHOOK_PREFIX.match(text)
    if hook is None:
        return local, None, text
    return local, int(hook["rank"]), text[hook.end() :]


def complete_lines(partial: bytes, data: bytes, max_line: int) -> tuple[list[bytes], bytes]:
    """The lines `data` completes after the unfinished `partial`, and what is left
    unfinished. A line still being redrawn with `\\r` (a progress bar: tqdm prints no
    newline until it ends) gives its finished updates at once, up to its last `\\r`; a
    line longer than `max_line` is given whole (its reader cuts it)."""
    lines = (partial + data).split(b"\n")
    rest = lines.pop()
    # Not at a last byte `\r`: a `\r\n` may be on its way.
    cut = rest.rfind(b"\r", 0, len(rest) - 1)
    if cut > 0 and rest[:cut].strip(b"\r"):
        lines.append(rest[:cut])
        rest = rest[cut:]
    if len(rest) > max_line:
        lines.append(rest)
        rest = b""
    return lines, rest


def split_rank(line: str) -> tuple[int | None, str]:
    """(local rank, text without the prefixes) for a line torchrun prefixed; (None, the
    line without torch's `[rankN]: `) otherwise."""
    local, _, text = rank_parts(line)
    return local, text


@dataclass(frozen=True)
class LinePattern:
    kind: str
    severity: Severity
    pattern: re.Pattern[str]
    meaning: str


#: Log lines worth a run event: NCCL/gloo warnings and the errors that precede hangs.
TROUBLE: tuple[LinePattern, ...] = (
    LinePattern(
        "collective_timeout",
        "critical",
        re.compile(r"collective operation timeout|Watchdog caught collective operation", re.I),
        "a collective timed out: a rank is stuck or gone",
    ),
    LinePattern(
        "nccl_system_error",
        "critical",
        re.compile(r"unhandled system error", re.I),
        "NCCL hit a system error (often the network or a driver)",
    ),
    LinePattern(
        "nccl_remote_error",
        "critical",
        re.compile(r"remote process exited or there was a network error", re.I),
        "a peer rank died or the network failed",
    ),
    LinePattern(
        "nccl_socket_fallback",
        "warning",
        re.compile(r"NET/Socket : Using|Using network Socket", re.I),
        "NCCL is using plain sockets (no InfiniBand/RoCE): expect lower bandwidth",
    ),
    LinePattern(
        "flight_recorder_dump",
        "warning",
        re.compile(r"(dump|dumping).{0,40}(flight recorder|nccl trace|debug info)", re.I),
        "the NCCL flight recorder dumped its trace into the run dir",
    ),
    LinePattern(
        "nccl_warn",
        "warning",
        re.compile(r"NCCL WARN"),
        "NCCL warning",
    ),
    LinePattern(
        "gloo_error",
        "critical",
        re.compile(
            r"Connection closed by peer|Connection reset by peer|Gloo connectFullMesh failed"
        ),
        "a gloo peer went away",
    ),
    LinePattern(
        "output_dropped",
        "warning",
        re.compile(r"^\[gpud-shim\] .* of output were dropped"),
        "the disk of the run's log was full: the shim dropped output (the run went on)",
    ),
)


def classify(text: str) -> LinePattern | None:
    for pattern in TROUBLE:
        if pattern.pattern.search(text):
            return pattern
    return None


@dataclass(frozen=True)
class RootCause:
    rank: int | None
    local_rank: int | None
    exitcode: int | None
    signal_name: str | None


_ROOT = re.compile(
    r"Root Cause \(first observed failure\):.*?rank\s*:\s*(?P<rank>\d+)\s*\(local_rank:\s*"
    r"(?P<local>\d+)\).*?exitcode\s*:\s*(?P<code>-?\d+)(?:[^\n]*?\((?P<sig>SIG[A-Z]+)\))?",
    re.S,
)


def root_cause(text: str) -> RootCause | None:
    """The first failed rank from torchrun's end-of-run summary, when it printed one."""
    # The last summary wins: an earlier one may be from a restarted attempt.
    matches = list(_ROOT.finditer(text))
    if not matches:
        return None
    match = matches[-1]
    return RootCause(
        rank=int(match["rank"]),
        local_rank=int(match["local"]),
        exitcode=int(match["code"]),
        signal_name=match["sig"],
    )


_ENTRY = re.compile(
    r"rank\s*:\s*(?P<rank>\d+)\s*\(local_rank:\s*(?P<local>\d+)\)[^\n]*\n"
    r"\s*exitcode\s*:\s*(?P<code>-?\d+)(?:[^\n]*?\((?P<sig>SIG[A-Z]+)\))?"
)


#: torchrun's agent, once a worker failed and it has ended the others, before its summary:
#: `failed (exitcode: -9) local_rank: 1 (pid: 4242) of binary: ...` (its first failure).
_AGENT_SAW = re.compile(r"\] failed \(exitcode: (?P<code>-?\d+)\) local_rank: (?P<local>\d+) ")


def first_seen_failure(text: str) -> RootCause | None:
    """The failed worker torchrun's agent names first, from the line it logs before its
    summary: the evidence that remains where the summary came cut or not at all (the
    agent killed as it printed it). The last such line wins (a restarted attempt's)."""
    matches = list(_AGENT_SAW.finditer(text))
    if not matches:
        return None
    match = matches[-1]
    return RootCause(
        rank=None, local_rank=int(match["local"]), exitcode=int(match["code"]), signal_name=None
    )


def failures(text: str) -> list[RootCause]:
    """Every failed rank in torchrun's last end-of-run summary: the other failures, then
    the root cause (torchrun's "first observed" is only as good as whole-second clocks)."""
    root = text.rfind("Root Cause (first observed failure):")
    if root == -1:
        return []
    start = text.rfind("Failures:", 0, root)
    block = text[start if start != -1 else root :]
    return [
        RootCause(
            rank=int(m["rank"]),
            local_rank=int(m["local"]),
            exitcode=int(m["code"]),
            signal_name=m["sig"],
        )
        for m in _ENTRY.finditer(block)
    ]
