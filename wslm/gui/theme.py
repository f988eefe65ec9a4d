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

# The two themes' colours (Settings → Theme). The module constants above are the dark ones; apply_theme()
# points them at the chosen theme's before the window is built, so inline styles follow it too.
PALETTES: dict[str, dict[str, str]] = {
    "dark": {"accent": ACCENT, "bg": BG, "panel": PANEL, "raised": RAISED, "border": BORDER, "text": TEXT,
             "muted": MUTED, "hover": "#1a1e26", "hover_border": "#3b4250", "button_hover": "#232833",
             "disabled": "#596074", "accent_hover": "#6aadff", "primary_disabled": "#2a3b55",
             "primary_disabled_text": "#7f8ba3", "on_accent": "#0b1220", "alternate": "#1a1d24",
             "selection": "#26324a", "scroll": "#2f3542", "indicator": "#4a5161", "placeholder": "#687086"},
    "light": {"accent": "#1f6feb", "bg": "#f6f7f9", "panel": "#ffffff", "raised": "#eef0f4", "border": "#d0d5de",
              "text": "#1b1f27", "muted": "#5b6475", "hover": "#e8ebf1", "hover_border": "#b4bccb",
              "button_hover": "#e3e7ee", "disabled": "#9aa3b2", "accent_hover": "#3b82f0",
              "primary_disabled": "#c4d5f3", "primary_disabled_text": "#6b7a94", "on_accent": "#ffffff",
              "alternate": "#f2f4f7", "selection": "#d6e4fb", "scroll": "#c3c9d4", "indicator": "#8a93a4",
              "placeholder": "#8a93a4"},
}
THEMES = {"dark": "Dark", "light": "Light"}  # Settings' choices: name -> label


def qss(c: dict[str, str]) -> str:
    return f"""
QWidget {{ color: {c['text']}; background-color: {c['bg']}; font-size: 10pt; }}
QWidget#Sidebar {{ background-color: {c['panel']}; border-right: 1px solid {c['border']}; }}
QLabel#Brand {{ font-size: 15pt; font-weight: 600; padding: 14px 14px 10px 14px; background: transparent; }}
QListWidget#Nav {{ background: transparent; border: none; outline: 0; }}
QListWidget#Nav::item {{ padding: 9px 14px; margin: 2px 8px; border-radius: 8px; color: {c['muted']}; }}
QListWidget#Nav::item:selected {{ background-color: {c['raised']}; color: {c['text']}; }}
QListWidget#Nav::item:hover {{ background-color: {c['hover']}; }}
QLabel {{ background: transparent; }}
QLabel#Title {{ font-size: 14pt; font-weight: 600; }}
QLabel#Muted, QLabel[muted="true"] {{ color: {c['muted']}; }}
QLabel#StateBadge {{ border-radius: 10px; padding: 3px 10px; font-weight: 600; }}
QFrame#Card {{ background-color: {c['panel']}; border: 1px solid {c['border']}; border-radius: 10px; }}
QFrame#Card QLabel, QFrame#Card QCheckBox {{ background: transparent; }}
QLineEdit, QPlainTextEdit, QTextEdit, QSpinBox, QDoubleSpinBox, QComboBox {{
    background-color: {c['raised']}; border: 1px solid {c['border']}; border-radius: 7px; padding: 5px 8px;
    selection-background-color: {c['accent']}; }}
QLineEdit:focus, QPlainTextEdit:focus, QComboBox:focus, QSpinBox:focus, QDoubleSpinBox:focus {{ border-color: {c['accent']}; }}
QComboBox QAbstractItemView {{ background-color: {c['raised']}; border: 1px solid {c['border']}; selection-background-color: {c['accent']}; }}
QPushButton {{ background-color: {c['raised']}; border: 1px solid {c['border']}; border-radius: 7px; padding: 6px 14px; }}
QPushButton:hover {{ border-color: {c['hover_border']}; background-color: {c['button_hover']}; }}
QPushButton:disabled {{ color: {c['disabled']}; }}
QPushButton#Primary {{ background-color: {c['accent']}; border-color: {c['accent']}; color: {c['on_accent']}; font-weight: 600; }}
QPushButton#Primary:hover {{ background-color: {c['accent_hover']}; }}
QPushButton#Primary:disabled {{ background-color: {c['primary_disabled']}; border-color: {c['primary_disabled']}; color: {c['primary_disabled_text']}; }}
QPushButton#Danger {{ color: {ERROR}; }}
QPushButton:focus, QToolButton:focus {{ border: 2px solid {c['accent']}; padding: 5px 13px; }}
QPushButton#Primary:focus {{ border: 2px solid {FOCUS_ON_ACCENT}; }}
QListView:focus, QTableView:focus, QTreeView:focus {{ border-color: {c['accent']}; }}
QCheckBox:focus, QRadioButton:focus {{ color: {c['accent']}; }}
QTextBrowser#Transcript {{ background-color: {c['bg']}; border: 1px solid transparent; border-radius: 6px; }}
QTextBrowser#Transcript:focus {{ border-color: {c['accent']}; }}
QListView, QTableView, QTreeView {{ background-color: {c['panel']}; border: 1px solid {c['border']}; border-radius: 8px;
    alternate-background-color: {c['alternate']}; outline: 0; }}
QListView::item {{ padding: 7px 8px; border-radius: 6px; }}
QListView::item:selected, QTableView::item:selected {{ background-color: {c['selection']}; color: {c['text']}; }}
QHeaderView::section {{ background-color: {c['panel']}; color: {c['muted']}; border: none; border-bottom: 1px solid {c['border']};
    padding: 6px 8px; font-weight: 600; }}
QTableView {{ gridline-color: transparent; }}
QTableView::item {{ padding: 0 8px; }}
QWidget#Row {{ background: transparent; }}
QProgressBar {{ background-color: {c['raised']}; border: 1px solid {c['border']}; border-radius: 6px; text-align: center; height: 16px; }}
QProgressBar::chunk {{ background-color: {c['accent']}; border-radius: 5px; }}
QStatusBar {{ background-color: {c['panel']}; border-top: 1px solid {c['border']}; color: {c['muted']}; }}
QStatusBar QLabel {{ color: {c['muted']}; padding: 0 8px; }}
QScrollBar:vertical {{ background: transparent; width: 10px; margin: 0; }}
QScrollBar::handle:vertical {{ background: {c['scroll']}; border-radius: 5px; min-height: 30px; }}
QScrollBar::add-line, QScrollBar::sub-line {{ height: 0; width: 0; }}
QScrollBar:horizontal {{ background: transparent; height: 10px; }}
QScrollBar::handle:horizontal {{ background: {c['scroll']}; border-radius: 5px; min-width: 30px; }}
QCheckBox::indicator, QRadioButton::indicator {{ width: 14px; height: 14px; border: 1px solid {c['indicator']};
    background-color: {c['raised']}; }}
QCheckBox::indicator {{ border-radius: 4px; }}
QRadioButton::indicator {{ border-radius: 8px; }}
QCheckBox::indicator:checked, QRadioButton::indicator:checked {{ background-color: {c['accent']}; border-color: {c['accent']}; }}
QCheckBox, QRadioButton {{ spacing: 8px; background: transparent; }}
QAbstractSpinBox::up-button, QAbstractSpinBox::down-button {{ width: 0px; border: none; }}
QComboBox::drop-down {{ border: none; width: 22px; }}
QGroupBox {{ border: 1px solid {c['border']}; border-radius: 10px; margin-top: 14px; padding: 10px; background-color: {c['panel']}; }}
QGroupBox::title {{ subcontrol-origin: margin; left: 10px; padding: 0 4px; color: {c['muted']}; }}
QSplitter::handle {{ background-color: {c['border']}; }}
QSplitter::handle:horizontal {{ width: 1px; }}
QToolTip {{ background-color: {c['raised']}; color: {c['text']}; border: 1px solid {c['border']}; }}
"""


QSS = qss(PALETTES["dark"])


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


def style_sheet(name: str = "dark") -> str:
    """The app's style sheet, with the drawn arrow every combo box (the first-run target box too) needs."""
    colors = PALETTES.get(name, PALETTES["dark"])
    return qss(colors) + f"QComboBox::down-arrow {{ image: url({arrow_image()}); width: 12px; height: 12px; }}\n"


def current_theme() -> str:
    return _current


_current = "dark"


def apply_theme(app: QApplication, name: str = "dark") -> None:
    """Style the app with theme `name` ("dark" | "light"; another name: dark). The module's colour constants
    follow, so widgets built afterwards style their own parts in it (those built before keep theirs until
    the next start)."""
    global _current, ACCENT, BG, PANEL, RAISED, BORDER, TEXT, MUTED
    name = name if name in PALETTES else "dark"
    c = PALETTES[name]
    _current = name
    ACCENT, BG, PANEL, RAISED, BORDER, TEXT, MUTED = (c[k] for k in ("accent", "bg", "panel", "raised", "border",
                                                                     "text", "muted"))
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
                        (QPalette.ColorRole.Link, ACCENT), (QPalette.ColorRole.PlaceholderText, c["placeholder"])):
        pal.setColor(role, QColor(color))
    app.setPalette(pal)
    app.setStyleSheet(style_sheet(name))


def _rgba(color: str, alpha: float) -> str:
    # Qt reads 8-digit hex as #AARRGGBB, not CSS's #RRGGBBAA: spell transparency out.
    c = QColor(color)
    return f"rgba({c.red()}, {c.green()}, {c.blue()}, {int(alpha * 255)})"


def badge_style(state: str) -> str:
    color = STATE_COLORS.get(state, MUTED)
    return f"background-color: {_rgba(color, 0.14)}; color: {color}; border: 1px solid {_rgba(color, 0.45)};"
