"""The chat's parameters: presets, the system prompt, sampling, and what is sent when the chat is too long.

A form over a params dict (the conversation's columns: system_prompt, temperature, top_p, max_tokens, top_k,
min_p, repetition_penalty, seed, stop, json_mode, reasoning). set_values() fills it without a signal; each
user edit emits `edited(values())`. Presets (kept in the chat store) carry the prompt and the sampling, as
LM Studio's do."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSizePolicy,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm.gui.chat_session import format_stop, parse_stop
from wslm.gui.context_fit import POLICIES

SAMPLING_KEYS = ("temperature", "top_p", "max_tokens", "top_k", "min_p", "repetition_penalty", "seed", "stop",
                 "json_mode", "reasoning")


class ChatParams(QWidget):
    """Signals: edited(dict) (the whole params dict, on each user edit), overflow_changed(str) (a
    context_fit policy), notice(str) (a preset saved)."""

    edited = Signal(dict)
    overflow_changed = Signal(str)
    notice = Signal(str)

    def __init__(self, store, overflow_policy: str, parent=None) -> None:
        super().__init__(parent)
        self.store = store  # the chat store: presets
        self._loading = False  # widgets being filled (set_values, a preset): not a user edit
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        # "Preset  [Save…] [✕]" over the picker: the row stays narrow enough for the smallest window.
        presets = QHBoxLayout()
        presets.addWidget(QLabel("Preset", objectName="Muted"), 1)
        self.preset_combo = QComboBox()
        self.preset_combo.setToolTip("Saved presets (system prompt and sampling): pick one for this chat")
        self.preset_combo.activated.connect(self._preset_chosen)
        self.preset_combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.preset_combo.setMinimumContentsLength(4)  # a long preset name must not widen the column
        self.preset_save = QPushButton("Save…")
        self.preset_save.setToolTip("Save this system prompt and these sampling settings as a preset")
        self.preset_save.clicked.connect(self._save_preset_dialog)
        self.preset_delete = QPushButton("✕")  # one glyph: the row fits the narrow column
        self.preset_delete.setAccessibleName("Delete preset")
        self.preset_delete.setToolTip("Delete the chosen preset (chats keep their settings)")
        self.preset_delete.clicked.connect(self._delete_preset)
        for b in (self.preset_save, self.preset_delete):
            b.setStyleSheet("QPushButton { padding: 4px 8px; }")
            b.setSizePolicy(QSizePolicy.Policy.Minimum, QSizePolicy.Policy.Fixed)  # never cut ("Sa")
            presets.addWidget(b)
        lay.addLayout(presets)
        lay.addWidget(self.preset_combo)
        lay.addWidget(QLabel("System prompt", objectName="Muted"))
        self.system_prompt = QPlainTextEdit()
        self.system_prompt.setTabChangesFocus(True)
        self.system_prompt.setFixedHeight(90)
        self.system_prompt.textChanged.connect(self._changed)
        lay.addWidget(self.system_prompt)
        form = QFormLayout()
        self.temperature = QDoubleSpinBox(minimum=0.0, maximum=2.0, singleStep=0.05, decimals=2)
        self.top_p = QDoubleSpinBox(minimum=0.01, maximum=1.0, singleStep=0.05, decimals=2)
        self.max_tokens = QSpinBox(minimum=1, maximum=131072, singleStep=128)
        # Optional sampling: at its "off"/"default" value it is left out of the request (the server's applies).
        self.top_k = QSpinBox(minimum=0, maximum=100000, specialValueText="off")
        self.min_p = QDoubleSpinBox(minimum=0.0, maximum=1.0, singleStep=0.01, decimals=2, specialValueText="off")
        self.repetition_penalty = QDoubleSpinBox(minimum=1.0, maximum=2.0, singleStep=0.05, decimals=2,
                                                 specialValueText="off")
        self.seed = QSpinBox(minimum=-1, maximum=2**31 - 1, specialValueText="random")
        self.stop_strings = QLineEdit(placeholderText="e.g. ###, \\n\\n")
        self.stop_strings.setToolTip("Strings that end the reply: comma-separated; \\n is a new line, \\, a comma")
        self.json_mode = QCheckBox("JSON mode")
        self.json_mode.setToolTip("The reply is one JSON object (response_format json_object)")
        self.reasoning = QComboBox()
        for label, value in (("Model default", None), ("On", True), ("Off", False)):
            self.reasoning.addItem(label, value)
        self.reasoning.setToolTip("Whether a thinking model reasons first (chat_template_kwargs enable_thinking)")
        for w in (self.temperature, self.top_p, self.max_tokens, self.top_k, self.min_p, self.repetition_penalty,
                  self.seed):
            w.valueChanged.connect(self._changed)
        self.stop_strings.textChanged.connect(self._changed)
        self.json_mode.toggled.connect(self._changed)
        self.reasoning.currentIndexChanged.connect(self._changed)
        for w in (self.temperature, self.top_p, self.max_tokens, self.top_k, self.min_p, self.repetition_penalty,
                  self.seed, self.stop_strings, self.reasoning):
            w.setMinimumWidth(60)  # not as wide as their longest value: the column stays narrow
        for label, w in (("Temperature", self.temperature), ("Top P", self.top_p), ("Max tokens", self.max_tokens),
                         ("Top K", self.top_k), ("Min P", self.min_p), ("Repeat penalty", self.repetition_penalty),
                         ("Seed", self.seed), ("Stop", self.stop_strings), ("Reasoning", self.reasoning),
                         ("", self.json_mode)):
            form.addRow(label, w)
        lay.addLayout(form)

        lay.addSpacing(10)
        lay.addWidget(QLabel("When the chat is too long", objectName="Muted", wordWrap=True))
        self.overflow = QComboBox()
        self.overflow.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.overflow.setMinimumContentsLength(6)  # the policy's long label must not widen the column
        for key, label in POLICIES.items():
            self.overflow.addItem(label, key)
        self.overflow.setCurrentIndex(max(0, self.overflow.findData(overflow_policy)))
        self.overflow.setToolTip("What is sent when the conversation no longer fits the model's context window: "
                                 "leave out the oldest messages (the system prompt stays), cut out the middle "
                                 "(the first and the newest messages stay), or send nothing and say so")
        self.overflow.currentIndexChanged.connect(lambda _i: self.overflow_changed.emit(self.overflow_policy()))
        lay.addWidget(self.overflow)
        self.fill_presets()

    def overflow_policy(self) -> str:
        return str(self.overflow.currentData())

    # The params dict
    def values(self) -> dict:
        rep = self.repetition_penalty.value()
        return {"system_prompt": self.system_prompt.toPlainText(), "temperature": self.temperature.value(),
                "top_p": self.top_p.value(), "max_tokens": self.max_tokens.value(),
                "top_k": self.top_k.value() or None, "min_p": self.min_p.value() or None,
                "repetition_penalty": rep if rep > 1.0 else None,
                "seed": None if self.seed.value() < 0 else self.seed.value(),
                "stop": parse_stop(self.stop_strings.text()), "json_mode": self.json_mode.isChecked(),
                "reasoning": self.reasoning.currentData()}

    def set_values(self, src: dict) -> None:
        """Show `src` (a conversation's vars, or the defaults for new chats); no `edited` signal. Keys it
        lacks keep their value."""
        self._loading = True
        try:
            if "system_prompt" in src:
                self.system_prompt.setPlainText(str(src.get("system_prompt") or ""))
            for key, box in (("temperature", self.temperature), ("top_p", self.top_p), ("max_tokens", self.max_tokens)):
                if src.get(key) is not None:
                    box.setValue(src[key])
            if "top_k" in src:
                self.top_k.setValue(src.get("top_k") or 0)
            if "min_p" in src:
                self.min_p.setValue(src.get("min_p") or 0.0)
            if "repetition_penalty" in src:
                self.repetition_penalty.setValue(src.get("repetition_penalty") or 1.0)
            if "seed" in src:
                self.seed.setValue(-1 if src.get("seed") is None else src["seed"])
            if "stop" in src:
                self.stop_strings.setText(format_stop(src.get("stop") or []))
            if "json_mode" in src:
                self.json_mode.setChecked(bool(src.get("json_mode")))
            if "reasoning" in src:
                self.reasoning.setCurrentIndex(max(0, self.reasoning.findData(src.get("reasoning"))))
        finally:
            self._loading = False
        self._sync_preset()

    def _changed(self, *_args) -> None:
        self._sync_preset()
        if not self._loading:
            self.edited.emit(self.values())

    # Presets
    def fill_presets(self) -> None:
        combo = self.preset_combo
        combo.blockSignals(True)
        combo.clear()
        combo.addItem("Custom", "")
        for name in self.store.presets():
            combo.addItem(name, name)
        combo.blockSignals(False)
        self._sync_preset()

    def _matches(self, name: str, prompt: str, values: dict) -> bool:
        params = self.store.preset_params(name)
        return all(values.get(k) == v or (k == "stop" and not values.get(k) and not v) for k, v in params.items())

    def _sync_preset(self) -> None:
        """The picker names the preset this chat's settings are (Custom once edited away from it)."""
        text, values = self.system_prompt.toPlainText(), self.values()
        name = next((n for n, p in self.store.presets().items() if p == text and self._matches(n, p, values)), "")
        self.preset_combo.setCurrentIndex(max(0, self.preset_combo.findData(name)))
        self.preset_delete.setEnabled(bool(name))

    def _preset_chosen(self, index: int) -> None:
        name = str(self.preset_combo.itemData(index) or "")
        self.apply_preset(name)

    def apply_preset(self, name: str) -> None:
        """Fill the prompt and the preset's sampling; saved for the chat as one edit."""
        prompt = self.store.presets().get(name)
        if prompt is None:
            return
        self.set_values({"system_prompt": prompt, **self.store.preset_params(name)})
        self.edited.emit(self.values())

    def save_preset(self, name: str) -> None:
        name = name.strip()
        if name:
            values = self.values()
            self.store.save_preset(name, values.pop("system_prompt"), {k: values[k] for k in SAMPLING_KEYS})
            self.fill_presets()
            self.notice.emit(f"Saved the preset “{name}”")

    def _save_preset_dialog(self) -> None:
        current = str(self.preset_combo.currentData() or "")
        name, ok = QInputDialog.getText(self, "Save preset", "Preset name:", text=current)
        if ok:
            self.save_preset(name)

    def _delete_preset(self) -> None:
        name = str(self.preset_combo.currentData() or "")
        if name:
            self.store.delete_preset(name)
            self.fill_presets()
