"""The bottom bar: backend state, model, tokens/s, KV-cache use."""

from __future__ import annotations

from PySide6.QtWidgets import QLabel, QStatusBar

from wslm.gui import theme

DOT = "●"


class StatusBar(QStatusBar):
    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setSizeGripEnabled(False)
        self.state = QLabel()
        self.model = QLabel()
        self.speed = QLabel()
        self.kv = QLabel()
        for w in (self.state, self.model, self.speed, self.kv):
            self.addPermanentWidget(w)
        self.set_state("stopped", "")
        self.set_model("")
        self.set_speed(None)
        self.set_kv(None)

    def set_state(self, state: str, target: str, words: str = "") -> None:
        """`words`: the state as the Server panel says it ("failed to start" rather than "crashed")."""
        color = theme.STATE_COLORS.get(state, theme.MUTED)
        where = f" on {target}" if target else ""
        self.state.setText(f"<span style='color:{color};'>{DOT}</span> Backend {words or state}{where}")

    def set_model(self, model: str) -> None:
        self.model.setText(f"Model: {model or '—'}")

    def set_speed(self, tokens_per_s: float | None, elsewhere: str = "") -> None:
        """The last chat reply's speed; `elsewhere`: the model that gave it when not our server's."""
        text = f"{tokens_per_s:.1f} tok/s" if tokens_per_s else "— tok/s"
        self.speed.setText(f"{text} ({elsewhere}, not this server)" if elsewhere and tokens_per_s else text)
        self.speed.setToolTip(f"The last chat reply, from {elsewhere} at the chat's own URL" if elsewhere else
                              "The last chat reply's speed")

    def set_kv(self, fraction: float | None) -> None:
        self.kv.setText(f"KV cache {fraction * 100:.0f}%" if fraction is not None else "KV cache —")
