"""The Server panel's "Speculative decoding" row (LM Studio's): a switch and the draft picker, prompt lookup
or one of the installed models. A view: it says what changed; the panel saves it and builds the flag."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QWidget

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm.embed_model import EMBED_NAME
from wslm.gui.models_model import display_name
from wslm.gui.speculative import speculative_config
from wslm.gui.toggle_switch import ToggleSwitch

PROMPT_LOOKUP = "Prompt lookup (no draft model)"


class SpeculativeBox(QWidget):
    changed = Signal()

    def __init__(self, enabled: bool = False, draft: str = "", parent=None) -> None:
        super().__init__(parent)
        self.models: list[dict] = []
        self.switch = ToggleSwitch()
        self.switch.setAccessibleName("Speculative decoding")
        self.switch.setChecked(enabled)
        self.switch.setToolTip(
            "--speculative-config: a cheap guess of the next tokens, checked by the model in one step. Same "
            "output, often faster on text that repeats (code edits, quoting). Takes effect at the next start.")
        self.label = QLabel("Speculative decoding", objectName="Muted")
        self.draft = QComboBox()
        self.draft.setAccessibleName("Draft")
        self.draft.setToolTip("Prompt lookup drafts from the conversation itself (no second model); a draft model "
                              "must be a smaller model with the same tokenizer (the same family).")
        self.draft.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.draft.setMinimumContentsLength(12)
        self.set_models([], draft)
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.switch)
        row.addWidget(self.label)
        row.addSpacing(8)
        row.addWidget(QLabel("Draft", objectName="Muted"))
        row.addWidget(self.draft, 1)
        self.switch.toggled.connect(self._toggled)
        self.draft.currentIndexChanged.connect(lambda _i: self.changed.emit())
        self.draft.setEnabled(enabled)

    def _toggled(self, on: bool) -> None:
        self.draft.setEnabled(on)
        self.changed.emit()

    def set_models(self, models: list[dict], draft: str | None = None, main: str = "") -> None:
        """Offer the installed models (not the one being served, nor the embedding model) as drafts; the
        chosen draft stays chosen (a saved one not installed now is kept, marked)."""
        keep = self.draft_id() if draft is None else draft
        if keep and keep == main:  # a model cannot be its own draft: prompt lookup instead
            keep = ""
        self.models = [m for m in models if isinstance(m, dict)]
        self.draft.blockSignals(True)
        self.draft.clear()
        self.draft.addItem(PROMPT_LOOKUP, "")
        for m in self.models:
            mid = str(m.get("id") or "")
            if mid and mid not in (main, EMBED_NAME):
                label = display_name(m)
                self.draft.addItem(label if label == mid else f"{label}  ({mid})", mid)
        i = self.draft.findData(keep)
        if i < 0:
            self.draft.addItem(f"{keep}  (not installed)", keep)
            i = self.draft.count() - 1
        self.draft.setCurrentIndex(i)
        self.draft.blockSignals(False)

    def enabled(self) -> bool:
        return self.switch.isChecked()

    def draft_id(self) -> str:
        return str(self.draft.currentData() or "")

    def config_json(self) -> str:
        """--speculative-config's value ("" when off): a draft model by its path as `models list` gives it."""
        if not self.enabled():
            return ""
        draft = self.draft_id()
        model = next((m for m in self.models if m.get("id") == draft), None)
        return speculative_config(str(model.get("path") or draft) if model else draft)
