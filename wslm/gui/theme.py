"""The app's look: a dark theme in the spirit of LM Studio / GPT4All, with CJK-capable font fallbacks."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QColor, QFont, QIcon, QPainter, QPalette, QPen, QPixmap
from PySide6.QtWidgets import QApplication

ACCENT = "#4f9dff"
BG = "#111318"
PANEL = "#171a21"
RAISED = "#1e222b"
BORDER = "#2a2f3a"
TEXT = "#e6e9ef"
MUTED = "#8d96a8"
OK = "#3fb950"
WARN = "#d29922"
ERROR = "#f85149"
FOCUS_ON_ACCENT = "#e6f0ff"  # the focus ring of an accent-filled button (an accent ring would not show)
LINK = "#6cb6ff"  # links in chat replies: blue and underlined, as links look
# Code blocks' syntax colours (keywords, strings, comments, numbers and literals, function names).
SYNTAX = {"keyword": "#c678dd", "string": "#98c379", "comment": "#7f848e", "number": "#d19a66",
          "function": "#61afef"}

# Latin first, then CJK families that Windows (YaHei, Meiryo, Malgun) and Linux (Noto CJK) ship.
UI_FONTS = ["Segoe UI", "Inter", "Noto Sans", "DejaVu Sans", "Microsoft YaHei UI", "Noto Sans CJK SC",
            "Meiryo", "Malgun Gothic"]

STATE_COLORS = {"stopped": MUTED, "starting": WARN, "loading": WARN, "ready": OK, "stopping": WARN, "crashed": ERROR}

QSS = f"""
QWidget {{ color: {TEXT}; background-color: {BG}; font-size: 10pt; }}
QWidget#Sidebar {{ background-color: {PANEL}; border-right: 1px solid {BORDER}; }}
QLabel#Brand {{ font-size: 15pt; font-weight: 600; padding: 14px 14px 10px 14px; background: transparent; }}
QListWidget#Nav {{ background: transparent; border: none; outline: 0; }}
QListWidget#Nav::item {{ padding: 9px 14px; margin: 2px 8px; border-radius: 8px; color: {MUTED}; }}
QListWidget#Nav::item:selected {{ background-color: {RAISED}; color: {TEXT}; }}
QListWidget#Nav::item:hover {{ background-color: #1a1e26; }}
QLabel {{ background: transparent; }}
QLabel#Title {{ font-size: 14pt; font-weight: 600; }}
QLabel#Muted, QLabel[muted="true"] {{ color: {MUTED}; }}
QLabel#StateBadge {{ border-radius: 10px; padding: 3px 10px; font-weight: 600; }}
QFrame#Card {{ background-color: {PANEL}; border: 1px solid {BORDER}; border-radius: 10px; }}
QFrame#Card QLabel, QFrame#Card QCheckBox {{ background: transparent; }}
QLineEdit, QPlainTextEdit, QTextEdit, QSpinBox, QDoubleSpinBox, QComboBox {{
    background-color: {RAISED}; border: 1px solid {BORDER}; border-radius: 7px; padding: 5px 8px;
    selection-background-color: {ACCENT}; }}
QLineEdit:focus, QPlainTextEdit:focus, QComboBox:focus, QSpinBox:focus, QDoubleSpinBox:focus {{ border-color: {ACCENT}; }}
QComboBox QAbstractItemView {{ background-color: {RAISED}; border: 1px solid {BORDER}; selection-background-color: {ACCENT}; }}
QPushButton {{ background-color: {RAISED}; border: 1px solid {BORDER}; border-radius: 7px; padding: 6px 14px; }}
QPushButton:hover {{ border-color: #3b4250; background-color: #232833; }}
QPushButton:disabled {{ color: #596074; }}
QPushButton#Primary {{ background-color: {ACCENT}; border-color: {ACCENT}; color: #0b1220; font-weight: 600; }}
QPushButton#Primary:hover {{ background-color: #6aadff; }}
QPushButton#Primary:disabled {{ background-color: #2a3b55; border-color: #2a3b55; color: #7f8ba3; }}
QPushButton#Danger {{ color: {ERROR}; }}
QPushButton:focus, QToolButton:focus {{ border: 2px solid {ACCENT}; padding: 5px 13px; }}
QPushButton#Primary:focus {{ border: 2px solid {FOCUS_ON_ACCENT}; }}
QListView:focus, QTableView:focus, QTreeView:focus {{ border-color: {ACCENT}; }}
QCheckBox:focus, QRadioButton:focus {{ color: {ACCENT}; }}
QTextBrowser#Transcript {{ background-color: {BG}; border: 1px solid transparent; border-radius: 6px; }}
QTextBrowser#Transcript:focus {{ border-color: {ACCENT}; }}
QListView, QTableView, QTreeView {{ background-color: {PANEL}; border: 1px solid {BORDER}; border-radius: 8px;
    alternate-background-color: #1a1d24; outline: 0; }}
QListView::item {{ padding: 7px 8px; border-radius: 6px; }}
QListView::item:selected, QTableView::item:selected {{ background-color: #26324a; color: {TEXT}; }}
QHeaderView::section {{ background-color: {PANEL}; color: {MUTED}; border: none; border-bottom: 1px solid {BORDER};
    padding: 6px 8px; font-weight: 600; }}
QTableView {{ gridline-color: transparent; }}
QTableView::item {{ padding: 0 8px; }}
QWidget#Row {{ background: transparent; }}
QProgressBar {{ background-color: {RAISED}; border: 1px solid {BORDER}; border-radius: 6px; text-align: center; height: 16px; }}
QProgressBar::chunk {{ background-color: {ACCENT}; border-radius: 5px; }}
QStatusBar {{ background-color: {PANEL}; border-top: 1px solid {BORDER}; color: {MUTED}; }}
QStatusBar QLabel {{ color: {MUTED}; padding: 0 8px; }}
QScrollBar:vertical {{ background: transparent; width: 10px; margin: 0; }}
QScrollBar::handle:vertical {{ background: #2f3542; border-radius: 5px; min-height: 30px; }}
QScrollBar::add-line, QScrollBar::sub-line {{ height: 0; width: 0; }}
QScrollBar:horizontal {{ background: transparent; height: 10px; }}
QScrollBar::handle:horizontal {{ background: #2f3542; border-radius: 5px; min-width: 30px; }}
QCheckBox::indicator, QRadioButton::indicator {{ width: 14px; height: 14px; border: 1px solid #4a5161;
    background-color: {RAISED}; }}
QCheckBox::indicator {{ border-radius: 4px; }}
QRadioButton::indicator {{ border-radius: 8px; }}
QCheckBox::indicator:checked, QRadioButton::indicator:checked {{ background-color: {ACCENT}; border-color: {ACCENT}; }}
QCheckBox, QRadioButton {{ spacing: 8px; background: transparent; }}
QAbstractSpinBox::up-button, QAbstractSpinBox::down-button {{ width: 0px; border: none; }}
QComboBox::drop-down {{ border: none; width: 22px; }}
QGroupBox {{ border: 1px solid {BORDER}; border-radius: 10px; margin-top: 14px; padding: 10px; background-color: {PANEL}; }}
QGroupBox::title {{ subcontrol-origin: margin; left: 10px; padding: 0 4px; color: {MUTED}; }}
QSplitter::handle {{ background-color: {BORDER}; }}
QSplitter::handle:horizontal {{ width: 1px; }}
QToolTip {{ background-color: {RAISED}; color: {TEXT}; border: 1px solid {BORDER}; }}
"""


def app_icon() -> QIcon:
    """The window/taskbar icon, drawn (no image files to ship): a rounded accent square with "w"."""
    icon = QIcon()
    for size in (16, 32, 64, 256):
        pm = QPixmap(size, size)
        pm.fill(Qt.GlobalColor.transparent)
        p = QPainter(pm)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        p.setPen(Qt.PenStyle.NoPen)
        p.setBrush(QColor(ACCENT))
        p.drawRoundedRect(QRectF(0, 0, size, size), size * 0.22, size * 0.22)
        font = QFont()
        font.setFamilies(UI_FONTS)
        font.setBold(True)
        font.setPixelSize(int(size * 0.7))
        p.setFont(font)
        p.setPen(QColor("#0b1220"))
        p.drawText(QRectF(0, -size * 0.06, size, size), Qt.AlignmentFlag.AlignCenter, "w")
        p.end()
        icon.addPixmap(pm)
    return icon


def arrow_image() -> str:
    """A drawn down-arrow (PNG in the temp folder) for combo boxes: once a style sheet restyles a
    QComboBox, Qt draws no arrow unless ::down-arrow names an image."""
    path = Path(tempfile.gettempdir()) / f"wslm-gui-{os.getuid() if hasattr(os, 'getuid') else 0}-arrow.png"
    if not path.exists():
        pm = QPixmap(20, 20)
        pm.fill(Qt.GlobalColor.transparent)
        p = QPainter(pm)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        p.setPen(QPen(QColor(MUTED), 2.2, Qt.PenStyle.SolidLine, Qt.PenCapStyle.RoundCap))
        p.drawPolyline([QPointF(5, 8), QPointF(10, 13), QPointF(15, 8)])
        p.end()
        tmp = path.with_suffix(f".{os.getpid()}.png")
        pm.save(str(tmp))
        os.replace(tmp, path)
    return path.as_posix()


def style_sheet() -> str:
    """The app's style sheet, with the drawn arrow every combo box (the first-run target box too) needs."""
    return QSS + f"QComboBox::down-arrow {{ image: url({arrow_image()}); width: 12px; height: 12px; }}\n"


def apply_theme(app: QApplication) -> None:
    app.setStyle("Fusion")
    app.setWindowIcon(app_icon())
    font = QFont()
    font.setFamilies(UI_FONTS)
    font.setPointSizeF(10)
    app.setFont(font)
    pal = QPalette()
    for role, color in ((QPalette.ColorRole.Window, BG), (QPalette.ColorRole.Base, PANEL),
                        (QPalette.ColorRole.AlternateBase, RAISED), (QPalette.ColorRole.Text, TEXT),
                        (QPalette.ColorRole.WindowText, TEXT), (QPalette.ColorRole.Button, RAISED),
                        (QPalette.ColorRole.ButtonText, TEXT), (QPalette.ColorRole.Highlight, ACCENT),
                        (QPalette.ColorRole.Link, ACCENT), (QPalette.ColorRole.PlaceholderText, "#687086")):
        pal.setColor(role, QColor(color))
    app.setPalette(pal)
    app.setStyleSheet(style_sheet())


def _rgba(color: str, alpha: float) -> str:
    # Qt reads 8-digit hex as #AARRGGBB, not CSS's #RRGGBBAA: spell transparency out.
    c = QColor(color)
    return f"rgba({c.red()}, {c.green()}, {c.blue()}, {int(alpha * 255)})"


def badge_style(state: str) -> str:
    color = STATE_COLORS.get(state, MUTED)
    return f"background-color: {_rgba(color, 0.14)}; color: {color}; border: 1px solid {_rgba(color, 0.45)};"
