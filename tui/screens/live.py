"""The base of every gputop screen: it is handed the model, redraws from it on the app's
timer, and knows which run (if any) the `s` and `r` keys act on."""

from __future__ import annotations

from textual.screen import Screen

from tui.model.fleet import FleetModel
from tui.widgets.filter_bar import FilterBar


class LiveScreen(Screen[None]):
    """A screen drawn from the model. Subclasses implement `refresh_model`."""

    #: The name `:` jumps to, and the crumb in the title bar.
    VIEW = ""

    def __init__(self, model: FleetModel) -> None:
        super().__init__()
        self.model = model
        self.ready = False  # every widget of the screen is mounted

    def on_mount(self) -> None:
        # Textual calls this after the subclass's own on_mount (handlers run down the MRO).
        self.ready = True

    def on_unmount(self) -> None:
        self.ready = False

    def refresh_model(self) -> None:
        """Redraw from the model (called on the app's timer, and once when shown)."""

    def selected_run(self) -> str | None:
        """The run `s` (stop) and `r` (resume) act on, if this screen has one."""
        return None

    def on_screen_resume(self) -> None:
        if self.ready:
            self.refresh_model()

    # ------------------------------------------------------------------ filter

    def action_filter(self) -> None:
        """`/`: open this screen's filter bar, if it has one."""
        bars = self.query(FilterBar)
        if bars:
            bars.first().open()

    def on_filter_bar_applied(self, message: FilterBar.Applied) -> None:
        self.apply_filter(message.value)

    def apply_filter(self, text: str) -> None:
        """Subclasses narrow what they show to `text`."""
