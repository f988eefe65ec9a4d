"""The chat's model picker rows, as LM Studio shows them: the name, then parameters · quant · size · context
in a muted line, and a "loaded" badge on each model the server has loaded now (with a model pool, more than
one), "loading" on one it is loading. A last row browses for a .gguf.

ModelPicker is the widget (the combo box and ⏏ beside it): it lists what it is told (installed models, files
chosen with Browse…, the server's pool states) and says what the user picked (`chosen`), nothing more; the
chat panel decides what a pick does (switch the server, load into its pool)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QRect, QSize, Qt, Signal
from PySide6.QtGui import QColor, QFont, QPainter, QPalette
from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QHBoxLayout,
    QMenu,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionComboBox,
    QStyleOptionViewItem,
    QStylePainter,
    QToolButton,
    QWidget,
)

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm.gui import theme
from wslm.gui.background import BackgroundCall
from wslm.gui.gguf_header import read_header
from wslm.gui.models_model import display_name, is_model_file, picker_details

DetailsRole = Qt.ItemDataRole.UserRole + 11  # "1.5B · Q4_K_M · 940.0 MiB · 32,768 ctx"
LoadedRole = Qt.ItemDataRole.UserRole + 12  # the server has this model loaded now
LoadingRole = Qt.ItemDataRole.UserRole + 13  # the server is loading it (its model pool, on the user's pick)
BROWSE = "\x00browse"  # the "Browse…" row's item data (no model id looks like it)
BROWSE_TEXT = "Browse for a .gguf file…"


class ModelPickerDelegate(QStyledItemDelegate):
    """Two lines a model (name; details), a green "loaded" pill on the right of each loaded one (an amber
    "loading" one while it loads)."""

    PAD = 6

    def sizeHint(self, option: QStyleOptionViewItem, index) -> QSize:
        base = super().sizeHint(option, index)
        lines = 2 if index.data(DetailsRole) else 1
        return QSize(base.width() + 70, option.fontMetrics.height() * lines + 2 * self.PAD + (2 if lines > 1 else 0))

    def paint(self, painter: QPainter, option: QStyleOptionViewItem, index) -> None:
        painter.save()
        selected = bool(option.state & QStyle.StateFlag.State_Selected)
        if selected:
            painter.fillRect(option.rect, QColor(theme.ACCENT).darker(170))
        rect = option.rect.adjusted(8, self.PAD, -8, -self.PAD)
        fm = option.fontMetrics
        name = str(index.data(Qt.ItemDataRole.DisplayRole) or "")
        details = str(index.data(DetailsRole) or "")
        badge_w = 0
        pill = ("loaded", theme.OK) if index.data(LoadedRole) else ("loading", theme.WARN) \
            if index.data(LoadingRole) else None
        if pill is not None:
            word, color = pill
            bold = QFont(option.font)
            bold.setPointSizeF(max(6.0, option.font.pointSizeF() * 0.85))
            bold.setBold(True)
            painter.setFont(bold)
            text_w = painter.fontMetrics().horizontalAdvance(word)
            badge = QRect(rect.right() - text_w - 12, rect.top() + 1, text_w + 12, fm.height() - 2)
            painter.setPen(Qt.PenStyle.NoPen)
            painter.setBrush(QColor(color).darker(250))
            painter.drawRoundedRect(badge, 7, 7)
            painter.setPen(QColor(color))
            painter.drawText(badge, Qt.AlignmentFlag.AlignCenter, word)
            badge_w = badge.width() + 8
        painter.setFont(option.font)
        browse = index.data(Qt.ItemDataRole.UserRole) == BROWSE
        painter.setPen(QColor(theme.ACCENT if browse else theme.TEXT))
        line = QRect(rect.left(), rect.top(), rect.width() - badge_w, fm.height())
        painter.drawText(line, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
                         fm.elidedText(name, Qt.TextElideMode.ElideMiddle, line.width()))
        if details:
            painter.setPen(QColor(theme.MUTED))
            line2 = QRect(rect.left(), rect.top() + fm.height() + 2, rect.width(), fm.height())
            painter.drawText(line2, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
                             fm.elidedText(details, Qt.TextElideMode.ElideRight, line2.width()))
        painter.restore()


QUANT_IN_NAME = re.compile(r"(?i)(?<![A-Z0-9])(I?Q\d(?:_[A-Z0-9]+)*|F16|BF16|F32)(?![A-Z0-9])")


def file_details(path: str, meta: dict | None = None) -> str:
    """A browsed .gguf's second line: what its header says (`meta`: num_params, quantization, context_length,
    when read), else the quantization its name gives, and its size on disk."""
    info = dict(meta or {})
    if not info.get("quantization"):
        found = QUANT_IN_NAME.findall(Path(path.replace("\\", "/")).stem)
        if found:
            info["quantization"] = found[-1].upper()
    try:
        info.setdefault("size_bytes", os.stat(path).st_size)
    except OSError:
        pass
    return picker_details(info) or "file on disk"


class PickerCombo(QComboBox):
    """The model picker's box: says when its list opens (the server's loaded models are then read anew),
    and shows a long name cut in the middle with "…" (Qt would clip it mid-letter)."""

    opening = Signal()

    def showPopup(self) -> None:
        self.opening.emit()
        super().showPopup()

    def paintEvent(self, event) -> None:
        if self.isEditable():
            super().paintEvent(event)
            return
        painter = QStylePainter(self)
        opt = QStyleOptionComboBox()
        self.initStyleOption(opt)
        painter.drawComplexControl(QStyle.ComplexControl.CC_ComboBox, opt)
        opt.currentText = self.shown_text()
        if self.currentIndex() < 0:  # the placeholder, muted as Qt draws it
            opt.palette.setBrush(QPalette.ColorRole.ButtonText, opt.palette.placeholderText())
        painter.drawControl(QStyle.ControlElement.CE_ComboBoxLabel, opt)

    def shown_text(self) -> str:
        """The current name as drawn: cut in the middle ("Qwen2.5-…-Q4_K_M.gguf") when wider than the box."""
        opt = QStyleOptionComboBox()
        self.initStyleOption(opt)
        field = self.style().subControlRect(QStyle.ComplexControl.CC_ComboBox, opt,
                                            QStyle.SubControl.SC_ComboBoxEditField, self)
        text = self.placeholderText() if self.currentIndex() < 0 else opt.currentText  # "no model"
        return self.fontMetrics().elidedText(text, Qt.TextElideMode.ElideMiddle, max(0, field.width() - 4))


class ModelPicker(QWidget):
    """The picker and ⏏. Signals: chosen(model id or file path) (the user picked a model in the list or a
    file with Browse…), opening (the list opens), eject_wanted(model id) (a ⏏ menu entry)."""

    chosen = Signal(str)
    opening = Signal()
    eject_wanted = Signal(str)

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.installed: list[dict] = []  # `models list`
        self.model_files: list[str] = []  # .gguf files chosen with "Browse…" (served by path)
        self.file_meta: dict[str, dict] = {}  # a browsed file's header (num_params, quantization, context)
        self.loaded_models: set[str] = set()  # what our server has loaded: "loaded" badges
        self.loading_model = ""  # what it is loading
        self.served = ""  # the model our server serves now ("" when none is ready)
        self.can_eject: Callable[[str], bool] = lambda model_id: False
        self.server_path: Callable[[str], str] = lambda path: path  # a file's path as the server sees it
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        self.combo = PickerCombo()
        self.combo.opening.connect(self.opening)
        self.combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.combo.setMinimumContentsLength(5)  # grows with the window (the header's stretch)
        self.combo.setToolTip("The model this chat talks to")
        self.combo.setItemDelegate(ModelPickerDelegate(self.combo))
        self.combo.activated.connect(self._activated)
        # Eject (LM Studio's ⏏): unload a model the server's pool holds, to give its memory back. A menu of
        # the loaded models beside the picker: a click in the picker's own list picks the model instead.
        self.eject_button = QToolButton(text="⏏")
        self.eject_button.setToolTip("Eject a model the server has loaded beside its own (frees its memory)")
        self.eject_button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.eject_button.setStyleSheet("QToolButton::menu-indicator { image: none; }")
        self.eject_button.setFocusPolicy(Qt.FocusPolicy.TabFocus)
        self.eject_button.setMenu(QMenu(self.eject_button))
        self.eject_button.menu().aboutToShow.connect(self.eject_actions)
        self.eject_button.hide()  # until the server has a model to eject
        lay.addWidget(self.combo, 1)
        lay.addWidget(self.eject_button)

    def model_name(self, model_id: str) -> str:
        return next((display_name(m) for m in self.installed if m.get("id") == model_id), model_id)

    def _loaded(self, model_id: str) -> bool:
        m = next((m for m in self.installed if m["id"] == model_id), {})
        return bool(self.served) and self.served in (model_id, m.get("path")) or model_id in self.loaded_models

    def fill(self, selected: str) -> None:
        """List the installed models, the browsed files and Browse…; `selected` shown (no signal)."""
        combo = self.combo
        combo.blockSignals(True)
        combo.setEditable(False)
        combo.clear()
        for m in self.installed:
            combo.addItem(display_name(m), m["id"])
            i = combo.count() - 1
            combo.setItemData(i, picker_details(m), DetailsRole)
            combo.setItemData(i, self._loaded(m["id"]), LoadedRole)
            combo.setItemData(i, m["id"] == self.loading_model, LoadingRole)
            combo.setItemData(i, "\n".join(t for t in (display_name(m), str(m.get("path") or ""),
                                                         picker_details(m)) if t), Qt.ItemDataRole.ToolTipRole)
        for extra in [selected, *self.model_files]:
            if extra and combo.findData(extra) < 0:
                combo.addItem(Path(extra.replace("\\", "/")).name if is_model_file(extra) else extra, extra)
                i = combo.count() - 1
                details = file_details(extra, self.file_meta.get(extra)) if is_model_file(extra) else ""
                combo.setItemData(i, details, DetailsRole)
                combo.setItemData(i, self._loaded(extra), LoadedRole)
                combo.setItemData(i, extra == self.loading_model, LoadingRole)
                combo.setItemData(i, "\n".join(t for t in (extra, details) if t), Qt.ItemDataRole.ToolTipRole)
        combo.addItem(BROWSE_TEXT, BROWSE)  # serve a .gguf from anywhere on disk, by its path
        combo.setItemData(combo.count() - 1, "Pick a model file on disk to serve", Qt.ItemDataRole.ToolTipRole)
        combo.setPlaceholderText("no model")
        i = combo.findData(selected)
        combo.setCurrentIndex(i if i >= 0 else (0 if combo.count() > 1 else -1))  # never "Browse…" itself
        combo.setToolTip(str(combo.currentData(Qt.ItemDataRole.ToolTipRole) or "The model this chat talks to"))
        combo.blockSignals(False)

    def set_pool_states(self, loaded: set[str], loading: str = "") -> None:
        """Badges marked in place: an open list stays open."""
        self.loaded_models, self.loading_model = set(loaded), loading
        combo = self.combo
        if combo.isEditable():
            return
        for i in range(combo.count()):
            model_id = combo.itemData(i)
            if model_id and model_id != BROWSE:
                combo.setItemData(i, self._loaded(model_id), LoadedRole)
                combo.setItemData(i, model_id == loading, LoadingRole)

    def choose_model_file(self) -> str:
        """Ask for a .gguf file to serve (tests replace this); "" when cancelled."""
        path, _ = QFileDialog.getOpenFileName(self, "Serve a model file", str(Path.home()),
                                              "GGUF models (*.gguf);;All files (*)")
        return path

    def _activated(self, index: int) -> None:
        model_id = str(self.combo.itemData(index) or "")
        if model_id != BROWSE:
            self.chosen.emit(model_id)
            return
        path = self.choose_model_file()
        if not path:
            self.chosen.emit("")  # cancelled: the chooser puts the chat's model back
            return
        served_path = self.server_path(path)
        self.file_meta.setdefault(served_path, {})
        if served_path != path:
            self.file_meta[served_path] = {"size_bytes": _size(path)}
        if served_path not in self.model_files:
            self.model_files.append(served_path)
        self.read_header(path, served_path)
        self.chosen.emit(served_path)

    def read_header(self, path: str, key: str) -> BackgroundCall:
        """Read the file's GGUF header off the GUI thread (quantization, context); its row's details follow
        when it is read. A file that cannot be read keeps its name's and size's details."""
        call = BackgroundCall(lambda: read_header(path), self)
        call.done.connect(lambda meta, k=key: self._header_read(k, meta))
        return call.start()

    def _header_read(self, key: str, meta: dict) -> None:
        if not meta:
            return
        self.file_meta[key] = {**self.file_meta.get(key, {}), **{k: v for k, v in meta.items() if v}}
        i = self.combo.findData(key)
        if i >= 0:
            details = file_details(key, self.file_meta[key])
            self.combo.setItemData(i, details, DetailsRole)
            self.combo.setItemData(i, f"{key}\n{details}", Qt.ItemDataRole.ToolTipRole)

    # Ejecting
    def ejectable(self) -> list[str]:
        """The loaded models the server can eject now, in the picker's order."""
        order = [m["id"] for m in self.installed] + self.model_files
        return sorted((m for m in self.loaded_models if self.can_eject(m)),
                      key=lambda m: (order.index(m) if m in order else len(order), m))

    def eject_actions(self) -> list:
        """The ⏏ menu, built anew as it opens: one "Eject NAME" action per ejectable model."""
        menu = self.eject_button.menu()
        menu.clear()
        for model_id in self.ejectable():
            mine = " (this chat's model)" if model_id == self.served else ""
            action = menu.addAction(f"Eject {self.model_name(model_id)}{mine}")
            action.setData(model_id)
            action.triggered.connect(lambda _checked=False, m=model_id: self.eject_wanted.emit(m))
        if menu.isEmpty():
            menu.addAction("No model to eject").setEnabled(False)
        return menu.actions()


def _size(path: str) -> int | None:
    try:
        return os.stat(path).st_size
    except OSError:
        return None
