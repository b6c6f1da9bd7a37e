"""The last lines of a run's logs, every node, with their global rank."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from gpud.wire.run_messages import is_log_mark
from tui.model.logs import LogLine
from tui.model.runs import RunView

RANK_COLORS = ["cyan", "green", "magenta", "yellow", "blue", "red"]


def line_text(line: LogLine, search: str | None = None) -> Text:
    text = Text()
    if line.rank is not None:
        text.append(f"r{line.rank:<3}", style=RANK_COLORS[line.rank % len(RANK_COLORS)])
    else:
        text.append(f"n{line.node_rank:<3}", style="dim")
    text.append(" ")
    body = Text(line.text)
    lowered = line.text.lower()
    if is_log_mark(line.text):
        body.stylize("bold reverse yellow")  # lines were dropped here: not to be missed
    elif "error" in lowered or "traceback" in lowered:
        body.stylize("red")
    elif "warn" in lowered:
        body.stylize("yellow")
    if search:
        body.highlight_words([search], style="reverse", case_sensitive=False)
    text.append_text(body)
    return text


class LogTail(Static):
    def __init__(self, id: str | None = None) -> None:
        super().__init__(id=id)
        self._shown: tuple[int, int, int] | None = None

    def show(self, run: RunView, lines: int) -> None:
        key = (run.logs.version, lines, self.size.width)
        if key == self._shown:
            return
        self._shown = key
        tail = run.logs.lines(limit=max(1, lines))
        if not tail:
            self.update(Text("no log lines yet", style="dim"))
            return
        out = Text()
        for i, line in enumerate(tail):
            if i:
                out.append("\n")
            shown = line_text(line)
            shown.truncate(max(20, self.size.width or 80) - 1, overflow="ellipsis")
            out.append_text(shown)
        self.update(out)
