"""Widgets for documents in chat: the attached files above the message box (each with ×), the Documents
settings (where passages are embedded), and a reply's "Sources:" line in the transcript."""

from __future__ import annotations

import html

from PySide6.QtCore import QRectF, Qt, Signal
from PySide6.QtGui import QColor, QIcon, QPainter, QPainterPath, QPen, QPixmap
from PySide6.QtWidgets import (
    QFormLayout,
    QFrame,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QScrollArea,
    QSpinBox,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm.gui import theme
from wslm.gui.attachments import DEFAULT_EMBED_MODEL, Attachments, describe
from wslm.gui.rag_store import ERROR
from wslm.gui.settings import Settings

FILE_FILTER = "Documents (*.txt *.md *.markdown *.pdf);;Text files (*)"
PASSAGE_HOVER_CHARS = 600


def paperclip_icon(color: str = theme.MUTED) -> QIcon:
    """A drawn paperclip for the attach button: emoji fonts are missing on many Linux and WSLg set-ups."""
    icon = QIcon()
    for size in (16, 24, 48):
        pm = QPixmap(size, size)
        pm.fill(Qt.GlobalColor.transparent)
        p = QPainter(pm)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        p.scale(size / 24, size / 24)
        p.translate(12, 12.5)
        p.rotate(40)
        p.translate(-12, -12.5)
        path = QPainterPath()
        path.moveTo(10, 8)  # the inner wire, then around the middle and the outer loop (a 24-unit box)
        path.lineTo(10, 16)
        path.arcTo(QRectF(10, 14, 4, 4), 180, 180)
        path.lineTo(14, 6)
        path.arcTo(QRectF(8, 3, 6, 6), 0, 180)
        path.lineTo(8, 18)
        path.arcTo(QRectF(8, 14, 8, 8), 180, 180)
        path.lineTo(16, 9)
        p.setPen(QPen(QColor(color), 1.8, Qt.PenStyle.SolidLine, Qt.PenCapStyle.RoundCap))
        p.drawPath(path)
        p.end()
        icon.addPixmap(pm)
    return icon


class AttachmentBar(QScrollArea):
    """The open chat's files as chips ("📄 notes.md · 12 passages ×"); hidden while there are none."""

    def __init__(self, attachments: Attachments, parent=None) -> None:
        super().__init__(parent)
        self.attachments = attachments
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setFixedHeight(34)
        inner = QWidget()
        self.row = QHBoxLayout(inner)
        self.row.setContentsMargins(0, 0, 0, 0)
        self.row.setSpacing(6)
        self.row.addStretch(1)
        self.setWidget(inner)
        self.chips: dict[int, QFrame] = {}  # attachment id -> its chip (tests click its ×)
        model = attachments.model
        for sig in (model.modelReset, model.rowsInserted, model.rowsRemoved, model.dataChanged):
            sig.connect(self.rebuild)
        self.rebuild()

    def rebuild(self, *_args) -> None:
        while self.row.count() > 1:
            item = self.row.takeAt(0)
            if item.widget() is not None:
                item.widget().deleteLater()
        self.chips = {}
        for i, att in enumerate(self.attachments.model.attachments()):
            chip = QFrame(objectName="Card")
            lay = QHBoxLayout(chip)
            lay.setContentsMargins(8, 2, 2, 2)
            lay.setSpacing(2)
            color = theme.ERROR if att.status == ERROR else theme.MUTED
            mark = "⚠ " if att.status == ERROR else ""
            label = QLabel(f"{mark}{html.escape(att.name)} <span style='color:{color};'>· "
                           f"{html.escape(describe(att))}</span>")
            label.setToolTip(f"{att.path}\n{att.error or describe(att)}")
            remove = QToolButton(text="×")
            remove.setAutoRaise(True)
            remove.setToolTip(f"Remove {att.name} from this chat")
            remove.clicked.connect(lambda _=False, a=att.id: self.attachments.remove(a))
            lay.addWidget(label)
            lay.addWidget(remove)
            chip.remove_button = remove
            self.row.insertWidget(i, chip)
            self.chips[att.id] = chip
        self.setVisible(bool(self.chips))


class DocumentSettings(QWidget):
    """Where attached documents are embedded, and how much of them a message gets."""

    changed = Signal()

    def __init__(self, settings: Settings, parent=None) -> None:
        super().__init__(parent)
        self.settings = settings
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(QLabel("Documents", objectName="Muted"))
        self.url = QLineEdit(settings.rag_embed_base_url, placeholderText="the chat's server")
        self.url.setToolTip("The OpenAI-compatible server that embeds attached documents (/v1/embeddings); "
                            "empty: the chat's own server")
        self.model = QLineEdit(settings.rag_embed_model, placeholderText=f"{DEFAULT_EMBED_MODEL} (ships with wslm)")
        self.model.setToolTip(f"The embedding model's name on that server; empty: {DEFAULT_EMBED_MODEL}, which ships "
                              "with wslm and which the wslm server serves beside the chat model (offline)")
        self.key = QLineEdit(settings.rag_embed_api_key, placeholderText="API key (optional)")
        self.key.setEchoMode(QLineEdit.EchoMode.Password)
        self.whole = QSpinBox(minimum=0, maximum=200_000, singleStep=500, value=settings.rag_whole_file_tokens)
        self.whole.setSuffix(" tokens")
        self.whole.setToolTip("A file up to this size (estimated) goes into the chat whole, without embeddings; "
                              "never more than half the model's context, when it is known (a larger file is "
                              "searched in passages)")
        self.top_k = QSpinBox(minimum=1, maximum=50, value=settings.rag_top_k)
        self.top_k.setToolTip("How many of the most similar passages each message gets")
        form = QFormLayout()
        form.addRow("Embed with", self.url)
        form.addRow("Model", self.model)
        form.addRow("Key", self.key)
        form.addRow("Whole file ≤", self.whole)
        form.addRow("Passages", self.top_k)
        lay.addLayout(form)
        for w in (self.url, self.model, self.key):
            w.editingFinished.connect(self._edited)
        for w in (self.whole, self.top_k):
            w.valueChanged.connect(self._edited)

    def _edited(self, *_args) -> None:
        s = self.settings
        s.rag_embed_base_url, s.rag_embed_model = self.url.text().strip(), self.model.text().strip()
        s.rag_embed_api_key = self.key.text()
        s.rag_whole_file_tokens, s.rag_top_k = self.whole.value(), self.top_k.value()
        self.changed.emit()


def sources_html(row: int, sources: list[dict], open_: set[int]) -> str:
    """ "Sources: notes.md §2, todo.txt": each label shows its passage on hover (tooltip) and, clicked,
    unfolded under the line (src:ROW:INDEX links; `open_` holds the unfolded indices)."""
    if not sources:
        return ""
    links = []
    for i, src in enumerate(sources):
        text = str(src.get("text") or "")
        hover = text if len(text) <= PASSAGE_HOVER_CHARS else text[:PASSAGE_HOVER_CHARS - 1] + "…"
        arrow = "▾ " if i in open_ else ""
        links.append(f'<a href="src:{row}:{i}" title="{html.escape(hover)}">{arrow}{html.escape(str(src.get("label")))}</a>')
    out = [f'<p style="color:{theme.MUTED}; font-size:small; margin-top:6px;">Sources: {", ".join(links)}</p>']
    for i in sorted(open_):
        if 0 <= i < len(sources):
            text = html.escape(str(sources[i].get("text") or "").strip()).replace("\n", "<br>")
            out.append(f'<table width="100%" cellpadding="8" style="background-color:#161a22; margin-top:4px;">'
                       f'<tr><td style="color:{theme.MUTED};"><b>{html.escape(str(sources[i].get("label")))}</b>'
                       f'<br>{text}</td></tr></table>')
    return "".join(out)
