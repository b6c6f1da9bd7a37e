"""The fleet: one row per node, grouped, with a bar cell per GPU.

Each node row: status dot, name, badge (online / offline / sim), one cell per GPU for its
activity (SM activity where the GPU reports it, else utilization) and one per GPU for its
memory, node health (XID, throttling, link errors), and the runs on it. Group rows (by the
cluster file's `group`, else by the name without its trailing number) carry the group's
own summary; enter on one folds it. Rows are lazy (`RowList`): a frame builds the cells
of the rows on screen only, each again only when its node's brief, liveness or runs
moved, and column widths come from the fleet's GPU count, not from measuring every row,
so a frame costs about the same at 256 nodes as at 8.
"""

from __future__ import annotations

from collections.abc import Callable

from rich.text import Span, Text

from tui.model import units
from tui.model.fleet import FleetModel
from tui.model.nodes import NodeView
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
#: " 100%" after a node's GPU bars: its average.
AVERAGE_CELLS = 5


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
    brief = node.brief
    if brief is None or not brief.gpus:
        return Text("no GPUs" if brief is not None else "–", style="dim"), Text("–", style="dim")
    util: list[tuple[str, str]] = []
    mem: list[tuple[str, str]] = []
    utils: list[float] = []
    dim = "" if online else " dim"
    for gpu in brief.gpus:
        if gpu.lost:
            util.append(("✗", "bold red"))
            mem.append(("✗", "bold red"))
            continue
        u, m = gpu.activity_pct, gpu.memory_pct
        if u is not None:
            utils.append(u)
        util.append((units.level(None if u is None else u / 100), util_style(u) + dim))
        mem.append((units.level(None if m is None else m / 100), mem_style(m) + dim))
    if utils:
        util.append((f" {sum(utils) / len(utils):3.0f}%", "" if online else "dim"))
    return styled(util), styled(mem)


def health_cell(node: NodeView, online: bool) -> Text:
    health = node.health()
    if node.brief is None:
        return Text(node.error if node.error else "–", style="dim")
    if health.ok:
        return Text("ok", style="green" if online else "dim")
    text = Text()
    if health.node_drained:
        text.append("DRAINED ", style="bold magenta")
    if health.quarantined:
        text.append(f"QUAR {len(health.quarantined)} ", style="bold red")
    if health.drained:
        text.append(f"DRN {len(health.drained)} ", style="magenta")
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


def active_runs(model: FleetModel, key: str) -> tuple[str, ...]:
    return tuple(r.id for r in model.runs_on(key) if r.active)


def runs_cell(runs: tuple[str, ...]) -> Text:
    """The first two runs' ids, and how many more."""
    text = Text(" ".join(runs[:2]))
    if len(runs) > 2:
        text.append(f" +{len(runs) - 2}", style="dim")
    return text


def node_cells(node: NodeView, now: float, runs: tuple[str, ...]) -> Cells:
    online = node.online(now)
    util, mem = gpu_bars(node, online)
    run_text = runs_cell(runs)
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
    loads = [n.load() for n in online]
    util_sum, util_count = sum(x.util_sum for x in loads), sum(x.util_count for x in loads)
    gpus = sum(x.gpus for x in loads)
    avg = f" {util_sum / util_count:.0f}% avg" if util_count else ""
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


def widths_for(gpus: int, groups: list[Cells]) -> list[int]:
    """Every column's width (plus a gap): the fixed ones, the GPU columns as wide as the
    most GPUs a node has (and its average), or a group's summary where that is wider."""
    natural = {"GPU UTIL": gpus + AVERAGE_CELLS, "MEM": gpus}
    widths = []
    for i, (title, fixed) in enumerate(COLUMNS):
        cells = [natural.get(title, 0), *(g[i].cell_len for g in groups)]
        widths.append(fixed if fixed is not None else max(len(title), *cells) + 1)
    return widths


def line(cells: Cells, widths: list[int]) -> Text:
    """One row: each cell padded (or cut, with an ellipsis) to its column."""
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


class FleetTable(RowList):
    def __init__(self) -> None:
        super().__init__(id="fleet-table")
        self.folded: set[str] = set()
        self.header = Text()
        # row key → (what the row depends on, its line): a row on screen is built again
        # only when its node's brief, liveness, runs or error, or the columns, changed.
        self._lines: dict[str, tuple[tuple[object, ...], Text]] = {}

    def show(self, model: FleetModel, needle: str = "") -> None:
        now = model.clock()
        groups: dict[str, list[NodeView]] = {}
        for node in model.nodes.values():
            if needle and not _matches(node, needle):
                continue
            groups.setdefault(node.group, []).append(node)
        keys: list[str] = []
        group_rows: dict[str, Cells] = {}
        runs: dict[str, tuple[str, ...]] = {}
        grouped = len(groups) > 1
        for name, nodes in groups.items():
            folded = name in self.folded
            if grouped:
                key = GROUP_PREFIX + name
                keys.append(key)
                group_rows[key] = group_cells(name, nodes, now, folded)
            if not (grouped and folded):
                keys.extend(n.key for n in nodes)
                runs.update((n.key, active_runs(model, n.key)) for n in nodes)
        gpus = max((len(n.brief.gpus) for n in model.nodes.values() if n.brief), default=0)
        widths = widths_for(gpus, list(group_rows.values()))
        self.header = line([Text(title, style="bold") for title, _ in COLUMNS], widths)
        if keys != self.keys:
            kept = set(keys)
            self._lines = {k: v for k, v in self._lines.items() if k in kept}
        # The last column is as long as its text: the rows are as wide as the longest.
        longest = max((runs_cell(r).cell_len for r in set(runs.values())), default=0)
        width = sum(widths[:-1]) + max(widths[-1], longest)
        self.set_rows(keys, self._line_for(model, now, widths, group_rows, runs), width)

    def _line_for(
        self,
        model: FleetModel,
        now: float,
        widths: list[int],
        group_rows: dict[str, Cells],
        runs: dict[str, tuple[str, ...]],
    ) -> Callable[[str], Text]:
        columns = tuple(widths)

        def line_of(key: str) -> Text:
            group = group_rows.get(key)
            if group is not None:
                return line(group, widths)
            node = model.nodes[key]
            with model.lock:
                version = (node.brief_version, node.online(now), runs[key], node.error, node.name)
                cached = self._lines.get(key)
                if cached is not None and cached[0] == (version, columns):
                    return cached[1]
                text = line(node_cells(node, now, runs[key]), widths)
            self._lines[key] = ((version, columns), text)
            return text

        return line_of

    def toggle(self, row_key: str) -> None:
        group = row_key.removeprefix(GROUP_PREFIX)
        self.folded.symmetric_difference_update({group})


def _matches(node: NodeView, needle: str) -> bool:
    needle = needle.lower()
    haystack = [node.name, node.label, node.group, *node.run_ids]
    return any(needle in h.lower() for h in haystack)
