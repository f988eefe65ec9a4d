"""A spin box whose lowest value means "not set" (its special value text, e.g. "model default"): clearing
the field, as a user clears any optional field, sets it back to that, instead of being refused."""

from __future__ import annotations

from PySide6.QtGui import QValidator
from PySide6.QtWidgets import QSpinBox

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)


class OptionalSpinBox(QSpinBox):
    def validate(self, text: str, pos: int):
        if not text.strip():
            return QValidator.State.Acceptable, text, pos
        return super().validate(text, pos)

    def valueFromText(self, text: str) -> int:
        return self.minimum() if not text.strip() else super().valueFromText(text)

    def fixup(self, text: str) -> str:
        return self.specialValueText() if not text.strip() else super().fixup(text)
