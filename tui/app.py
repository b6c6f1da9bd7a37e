"""gputop: the Textual app. Screens live in `tui/screens`, widgets in `tui/widgets`, the
model and feed (no Textual) in `tui/model`; the command line is `tui/cli.py`.

The app owns the model and hands it down to each screen; screens send messages up
(`ShowNode`, `ShowRun`, `ShowLogs`) and the app navigates. A timer redraws the current
screen from the model, so however many events arrive between two frames, they cost one
redraw. Stop and resume run in worker threads; their failures become notifications.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any, ClassVar

from textual import work
from textual.app import App
from textual.binding import Binding, BindingType
from textual.css.query import NoMatches

from gpud.wire.client import Client, ClientError, NodeTarget
from tui.messages import ShowLogs, ShowNode, ShowRun
from tui.model import actions
from tui.model.feed import Feed
from tui.model.fleet import FleetModel
from tui.screens.confirm import ConfirmScreen
from tui.screens.fleet import FleetScreen
from tui.screens.help import HelpScreen
from tui.screens.jump import JumpScreen, parse_jump
from tui.screens.live import LiveScreen
from tui.screens.logs import LogsScreen
from tui.screens.node import NodeScreen
from tui.screens.run import RunScreen
from tui.screens.runs import RunsScreen

#: After this long, what gputop holds for good (modules, widgets, the fleet's first
#: state) is moved out of the collector's sight (`gc.freeze`).
SETTLE_S = 3.0
#: Young-generation threshold: at 256 nodes the feed allocates ~50k objects a second;
#: at Python's 700 a collection ran every few ms and a full one landed in a frame every
#: second or so (60 ms: the frame's p95). Measured with bench/tui_scale.py.
GC_THRESHOLD = (7000, 20, 20)


def settle_memory() -> None:
    """Once per process: collect, freeze what survives, and collect less often."""
    if gc.get_threshold() == GC_THRESHOLD:
        return  # settled already
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)


class GpuTop(App[None]):
    CSS_PATH = "gputop.tcss"
    TITLE = "gputop"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("colon", "jump", "Jump", key_display=":"),
        Binding("slash", "filter", "Filter", key_display="/"),
        Binding("escape", "go_back", "Back", key_display="esc"),
        Binding("s", "stop", "Stop"),
        Binding("r", "resume", "Resume"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(
        self,
        model: FleetModel,
        feed: Feed | None = None,
        readonly: bool = False,
        refresh_s: float = 0.5,
        start_run: str | None = None,
        client_factory: Callable[[NodeTarget], Client] | None = None,
    ) -> None:
        super().__init__()
        self.model = model
        self.feed = feed
        self.readonly = readonly
        self.refresh_s = refresh_s
        self.start_run = start_run
        self.client_factory = client_factory

    def on_mount(self) -> None:
        self.push_screen(FleetScreen(self.model))
        if self.start_run:
            # under Runs, as its breadcrumb says: Esc goes back to the Runs table
            self.push_screen(RunsScreen(self.model))
            self.push_screen(RunScreen(self.model, self.start_run))
        if self.feed is not None:
            self.feed.start()
        self.set_interval(self.refresh_s, self.redraw)
        self.set_timer(SETTLE_S, settle_memory)

    def on_unmount(self) -> None:
        if self.feed is not None:
            self.feed.stop(timeout_s=1.0)

    def redraw(self) -> None:
        screen = self.screen
        if not (isinstance(screen, LiveScreen) and screen.ready):
            return
        try:
            screen.refresh_model()
        except NoMatches:
            pass  # the app is closing: the screen's widgets are already gone

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # --readonly: stop and resume do nothing and leave the footer.
        return not (action in actions.VERBS and self.readonly)

    # ------------------------------------------------------------ navigation

    def on_show_node(self, message: ShowNode) -> None:
        self.push_screen(NodeScreen(self.model, message.key))

    def on_show_run(self, message: ShowRun) -> None:
        self.push_screen(RunScreen(self.model, message.run_id))

    def on_show_logs(self, message: ShowLogs) -> None:
        self.push_screen(LogsScreen(self.model, message.run_id, message.node_rank))

    def action_go_back(self) -> None:
        if len(self.screen_stack) > 2:
            self.pop_screen()

    def action_help(self) -> None:
        screen = self.screen
        keys: list[tuple[str, str]] = []
        name = "this screen"
        if isinstance(screen, LiveScreen):
            name = screen.VIEW
            keys = [
                (b.key_display or b.key, b.description)
                for b in screen.BINDINGS
                if isinstance(b, Binding)
            ]
        self.push_screen(HelpScreen(name, keys, self.readonly))

    def action_filter(self) -> None:
        if isinstance(self.screen, LiveScreen):
            self.screen.action_filter()

    def action_jump(self) -> None:
        with self.model.lock:
            names = [f"node {n.name}" for n in self.model.nodes.values()]
            runs = [f"run {r.id}" for r in self.model.sorted_runs()]
        self.push_screen(JumpScreen([*names, *runs]), self.jump)

    def jump(self, command: str | None) -> None:
        view, arg = parse_jump(command or "")
        if view == "fleet":
            while len(self.screen_stack) > 2:
                self.pop_screen()
        elif view == "runs":
            self.push_screen(RunsScreen(self.model))
        elif view == "node":
            node = self.model.node_by_name(arg) if arg else None
            if node is None:
                self.notify(f"no node {arg!r}", severity="warning")
            else:
                self.push_screen(NodeScreen(self.model, node.key))
        elif view in ("run", "logs"):
            run_id = self.model.find_run(arg) if arg else self._selected_run()
            if run_id is None:
                self.notify(f"no run {arg!r}" if arg else "which run?", severity="warning")
            elif view == "run":
                self.push_screen(RunScreen(self.model, run_id))
            else:
                self.push_screen(LogsScreen(self.model, run_id))
        elif view == "help":
            self.action_help()
        elif view == "quit":
            self.exit()
        elif view:
            self.notify(f"unknown screen {view!r}: try fleet, runs, node, run, logs", timeout=4)

    def _selected_run(self) -> str | None:
        return self.screen.selected_run() if isinstance(self.screen, LiveScreen) else None

    # ------------------------------------------------------------ actions

    def action_stop(self) -> None:
        self._ask("stop")

    def action_resume(self) -> None:
        self._ask("resume")

    def _ask(self, verb: str) -> None:
        if self.readonly:
            return
        run_id = self._selected_run()
        if run_id is None:
            self.notify(f"select a run to {verb} first", severity="warning", timeout=4)
            return
        try:
            plan = actions.plan(self.model, verb, run_id)
        except actions.ActionRefused as exc:
            self.notify(str(exc), severity="warning", timeout=5)
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self.notify(f"{verb} {run_id}: asking {plan.target.label}…", timeout=3)
                self.perform(plan)

        self.push_screen(ConfirmScreen(f"{verb.capitalize()} run?", plan.question), answered)

    @work(thread=True, exit_on_error=False, group="actions")
    def perform(self, plan: actions.ActionPlan) -> None:
        try:
            summary = actions.perform(plan, self.client_factory)
        except ClientError as exc:
            self._notify_from_thread(f"{plan.verb} {plan.run_id} failed: {exc}", "error")
            return
        except Exception as exc:  # never let an action take the UI down
            self._notify_from_thread(
                f"{plan.verb} {plan.run_id} failed: {type(exc).__name__}: {exc}", "error"
            )
            return
        with self.model.lock:
            run = self.model.runs.get(plan.run_id)
            if run is not None:
                run.add_summary(plan.target.control, summary)
                self.model.version += 1
        self._notify_from_thread(
            f"{plan.verb} {plan.run_id}: {summary.state.value}"
            + (f" ({summary.reason})" if summary.reason else ""),
            "information",
        )

    def _notify_from_thread(self, message: str, severity: Any) -> None:
        self.call_from_thread(self.notify, message, severity=severity, timeout=8, markup=False)
