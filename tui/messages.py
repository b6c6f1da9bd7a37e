"""Messages that travel up from screens and widgets to the app ("attributes down,
messages up"): where to go next, and which action to ask about."""

from __future__ import annotations

from textual.message import Message


class ShowNode(Message):
    def __init__(self, key: str) -> None:
        super().__init__()
        self.key = key


class ShowRun(Message):
    def __init__(self, run_id: str) -> None:
        super().__init__()
        self.run_id = run_id


class ShowLogs(Message):
    def __init__(self, run_id: str, node_rank: int | None = None) -> None:
        super().__init__()
        self.run_id = run_id
        self.node_rank = node_rank
