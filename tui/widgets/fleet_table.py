"""The fleet: one row per node, grouped, with a bar cell per GPU.

Each node row: status dot, name, badge (online / offline / sim), one cell per GPU for its
activity (SM activity where the GPU reports it, else utilization) and one per GPU for its
memory, node health (XID, throttling, link errors), and the runs on it. Group rows (by the
cluster file's `group`, else by the name without its trailing number) carry the group's
own summary; enter on one folds it. Rows are drawn by `RowList`, which repaints only the
rows that changed: the fleet stays cheap at 64 nodes and more.
"""

from __future__ import annotations

from rich.text import Span, Text

from tui.model import units
from tui.model.fleet import FleetModel
from tui.model.nodes import NodeView, activity_pct, memory_pct
from tui.widgets.row_list import RowList

GROUP_PREFIX = "group:"
#: (title, width); None: as wide as the widest cell.
COLUMNS: list[tuple[str, int | None]] = [
    ("", 2),
    ("NODE", 15),
    ("STATE", 8),
    ("GPU UTIL", None),
    ("MEM", None),
    ("HEALTH", 16),
    ("RUNS", None),
]
Cells = list[Text]


def util_style(pct: float | None) -> str:
    if pct is None:
        return "dim"
    if pct >= 70:
        return "green"
    if pct >= 20:
        return "yellow"
    return "bright_black"


def mem_style(pct: float | None) -> str:
    if pct is None:
        return "dim"
    return "red" if pct >= 95 else "magenta"


def styled(parts: list[tuple[str, str]]) -> Text:
    """One Text from (text, style) parts, built in one go (Text.append per part costs a
    control-code scan each: too slow for 64 rows of 16 one-cell bars, twice a second)."""
    spans = []
    offset = 0
    for text, style in parts:
        if style:
            spans.append(Span(offset, offset + len(text), style))
        offset += len(text)
    return Text("".join(text for text, _ in parts), spans=spans, no_wrap=True, end="")


def gpu_bars(node: NodeView, online: bool) -> tuple[Text, Text]:
    snap = node.snapshot
    if snap is None or not snap.gpus:
        return Text("no GPUs" if snap is not None else "–", style="dim"), Text("–", style="dim")
    util: list[tuple[str, str]] = []
    mem: list[tuple[str, str]] = []
    utils: list[float] = []
    dim = "" if online else " dim"
    for gpu in snap.gpus:
        if gpu.lost:
            util.append(("✗", "bold red"))
            mem.append(("✗", "bold red"))
            continue
        u, m = activity_pct(gpu), memory_pct(gpu)
        if u is not None:
            utils.append(u)
        util.append((units.level(None if u is None else u / 100), util_style(u) + dim))
        mem.append((units.level(None if m is None else m / 100), mem_style(m) + dim))
    if utils:
        util.append((f" {sum(utils) / len(utils):3.0f}%", "" if online else "dim"))
    return styled(util), styled(mem)


def health_cell(node: NodeView, online: bool) -> Text:
    health = node.health()
    if node.snapshot is None:
        return Text(node.error if node.error else "–", style="dim")
    if health.ok:
        return Text("ok", style="green" if online else "dim")
    text = Text()
    if health.lost:
        text.append(f"LOST {len(health.lost)} ", style="bold red")
    if health.xid:
        text.append(f"XID {health.xid} ", style="bold red")
    if health.ecc_uncorrected:
        text.append(f"ECC {health.ecc_uncorrected} ", style="red")
    if health.throttled:
        text.append(f"THR {len(health.throttled)} ", style="yellow")
    if health.link_errors:
        text.append(f"link {health.link_errors}", style="yellow")
    text.rstrip()
    return text


def badge(node: NodeView, online: bool) -> Text:
    if not online:
        return Text("offline", style="bold red")
    if node.simulated:
        return Text("sim", style="bold yellow")
    return Text("online", style="bold green")


def node_cells(model: FleetModel, node: NodeView, now: float) -> Cells:
    online = node.online(now)
    util, mem = gpu_bars(node, online)
    runs = [r for r in model.runs_on(node.key) if r.active]
    run_text = Text(" ".join(r.id for r in runs[:2]))
    if len(runs) > 2:
        run_text.append(f" +{len(runs) - 2}", style="dim")
    return [
        Text("●" if online else "○", style="green" if online else "red"),
        Text(node.name, style="bold" if online else "dim"),
        badge(node, online),
        util,
        mem,
        health_cell(node, online),
        run_text,
    ]


def group_cells(name: str, nodes: list[NodeView], now: float, folded: bool) -> Cells:
    online = [n for n in nodes if n.online(now)]
    utils = [
        u
        for n in online
        if n.snapshot is not None
        for g in n.snapshot.gpus
        if (u := activity_pct(g)) is not None
    ]
    gpus = sum(len(n.snapshot.gpus) for n in online if n.snapshot is not None)
    avg = f" {sum(utils) / len(utils):.0f}% avg" if utils else ""
    trouble = sum(1 for n in online if not n.health().ok)
    return [
        Text("▸" if folded else "▾", style="bold cyan"),
        Text(name, style="bold cyan"),
        Text(f"{len(online)}/{len(nodes)} up", style="cyan"),
        Text(f"{gpus} GPUs{avg}", style="cyan"),
        Text(""),
        Text(f"{trouble} with trouble" if trouble else "", style="yellow"),
        Text(""),
    ]


def layout(rows: list[tuple[str, Cells]]) -> tuple[Text, list[tuple[str, Text]]]:
    """The header and one Text per row, every column as wide as it needs (plus a gap)."""
    widths = []
    for i, (title, width) in enumerate(COLUMNS):
        if width is None:
            widths.append(max([len(title), *(cells[i].cell_len for _, cells in rows)]) + 1)
        else:
            widths.append(width)

    def line(cells: Cells) -> Text:
        plain: list[str] = []
        spans: list[Span] = []
        offset = 0
        last = len(cells) - 1
        for i, (cell, width) in enumerate(zip(cells, widths, strict=True)):
            shown = cell
            if i < last and cell.cell_len >= width:
                shown = cell.copy()
                shown.truncate(width - 1, overflow="ellipsis")
            text = shown.plain
            if shown.style:
                spans.append(Span(offset, offset + len(text), shown.style))
            spans.extend(Span(offset + s.start, offset + s.end, s.style) for s in shown.spans)
            if i < last:
                text += " " * (width - shown.cell_len)
            plain.append(text)
            offset += len(text)
        return Text("".join(plain), spans=spans, no_wrap=True, end="")

    header = line([Text(title, style="bold") for title, _ in COLUMNS])
    return header, [(key, line(cells)) for key, cells in rows]


class FleetTable(RowList):
    def __init__(self) -> None:
        super().__init__(id="fleet-table")
        self.folded: set[str] = set()
        self.header = Text()
        # node key → (what the row depends on, its cells): a row is rebuilt only when its
        # node's snapshot, liveness, runs or error changed, not on every frame.
        self._cells: dict[str, tuple[tuple[object, ...], Cells]] = {}

    def _node_cells(self, model: FleetModel, node: NodeView, now: float) -> Cells:
        runs = tuple(r.id for r in model.runs_on(node.key) if r.active)
        key = (id(node.snapshot), node.online(now), runs, node.error, node.name)
        cached = self._cells.get(node.key)
        if cached is not None and cached[0] == key:
            return cached[1]
        cells = node_cells(model, node, now)
        self._cells[node.key] = (key, cells)
        return cells

    def show(self, model: FleetModel, needle: str = "") -> None:
        now = model.clock()
        groups: dict[str, list[NodeView]] = {}
        for node in model.nodes.values():
            if needle and not _matches(node, needle):
                continue
            groups.setdefault(node.group, []).append(node)
        rows: list[tuple[str, Cells]] = []
        grouped = len(groups) > 1
        for name, nodes in groups.items():
            folded = name in self.folded
            if grouped:
                rows.append((GROUP_PREFIX + name, group_cells(name, nodes, now, folded)))
            if not (grouped and folded):
                rows.extend((n.key, self._node_cells(model, n, now)) for n in nodes)
        self.header, lines = layout(rows)
        self.set_rows(lines)

    def toggle(self, row_key: str) -> None:
        group = row_key.removeprefix(GROUP_PREFIX)
        self.folded.symmetric_difference_update({group})


def _matches(node: NodeView, needle: str) -> bool:
    needle = needle.lower()
    haystack = [node.name, node.label, node.group, *node.run_ids]
    return any(needle in h.lower() for h in haystack)
