"""The top line of every screen, k9s style: where you are, then what matters there."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static


class TitleBar(Static):
    _key: tuple[object, ...] | None = None

    def show(self, crumbs: list[str], info: Text | str = "", readonly: bool = False) -> None:
        key = (tuple(crumbs), str(info), readonly)
        if key == self._key:
            return
        self._key = key
        text = Text()
        text.append(" gputop ", style="bold reverse")
        for crumb in crumbs:
            text.append(" › ", style="dim")
            text.append(crumb, style="bold")
        if readonly:
            text.append("  [read-only]", style="bold yellow")
        if info:
            text.append("  ")
            text.append(info if isinstance(info, Text) else Text(info))
        self.update(text)
