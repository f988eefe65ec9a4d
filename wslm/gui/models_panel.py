"""Models panel: the table from `models list --json`, download, delete with confirmation, disk use."""

from __future__ import annotations

import html

from PySide6.QtCore import QEvent, Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QFrame,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QMessageBox,
    QPushButton,
    QTableView,
    QVBoxLayout,
    QWidget,
)

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm.gui.discover_dialog import DiscoverDialog
from wslm.gui.download_dialog import DownloadDialog
from wslm.gui.download_job import DONE, PullJob
from wslm.gui.download_view import DownloadProgressView
from wslm.gui.format import human_bytes
from wslm.gui.models_model import ModelRole, display_name, fit_hint
from wslm.gui.models_service import ModelsService

NO_SELECTION = "Select a model to see where it is and how much memory it needs."


class ModelsPanel(QWidget):
    use_model = Signal(str)  # "Serve this model" → server panel
    endpoint_changed = Signal(str)  # the Mirror endpoint last used (Download or Discover): saved in settings

    def __init__(self, service: ModelsService, hub_endpoint: str = "", parent=None) -> None:
        super().__init__(parent)
        self.service = service
        self.hub_endpoint = hub_endpoint
        self.jobs: list[PullJob] = []
        self.dialog: DownloadDialog | None = None

        title = QLabel("Models", objectName="Title")
        self.summary = QLabel(objectName="Muted")
        self.summary.setMinimumWidth(1)  # long text must not set the window's minimum width
        self.download_button = QPushButton("⬇  Download…", objectName="Primary")
        self.download_button.clicked.connect(self.open_download)
        self.discover_button = QPushButton("Discover…")  # no emoji: Linux desktops often lack a colour emoji font
        self.discover_button.setToolTip("Search the hub for models, see which files fit this machine")
        self.discover_button.clicked.connect(self.open_discover)
        self.serve_button = QPushButton("Serve")
        self.serve_button.setToolTip("Serve the selected model (the Server panel, with this model chosen)")
        self.serve_button.clicked.connect(self._serve_selected)
        self.delete_button = QPushButton("Delete", objectName="Danger")
        self.delete_button.clicked.connect(self._delete_selected)
        refresh = QPushButton("↻  Refresh")
        refresh.clicked.connect(service.refresh)
        head = QHBoxLayout()
        head.addWidget(title)
        head.addSpacing(12)
        head.addWidget(self.summary, 1)
        for b in (refresh, self.delete_button, self.serve_button, self.discover_button, self.download_button):
            head.addWidget(b)

        self.table = QTableView()
        self.table.setModel(service.table)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setAlternatingRowColors(True)
        self.table.setShowGrid(False)
        self.table.setWordWrap(False)
        self.table.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        self.table.verticalHeader().hide()
        self.table.verticalHeader().setDefaultSectionSize(34)
        header = self.table.horizontalHeader()
        # Widths set by fit_columns (on resize and on new rows): the name column is never squeezed to "…".
        header.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        header.setStretchLastSection(False)
        self.table.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)  # the columns fit
        header.setDefaultAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter)
        self.table.installEventFilter(self)
        service.table.modelReset.connect(self.fit_columns)
        self.table.doubleClicked.connect(lambda _i: self._serve_selected())

        self.details = QLabel()
        self.details.setWordWrap(True)
        self.details.setTextFormat(Qt.TextFormat.RichText)
        self.details.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.details.setText(NO_SELECTION)
        self.table.selectionModel().selectionChanged.connect(self._show_details)
        # A refresh resets the table (and its selection): the same model is selected again and its details
        # re-read, or the card says none is selected; it kept the old figures (or a deleted model) before.
        self._selected_id = ""
        service.table.modelAboutToBeReset.connect(self._remember_selection)
        service.table.modelReset.connect(self._restore_selection)
        self.error = QLabel()
        self.error.setWordWrap(True)
        self.error.hide()
        self.downloads = QVBoxLayout()
        lay = QVBoxLayout(self)
        lay.setContentsMargins(18, 14, 18, 14)
        lay.addLayout(head)
        lay.addWidget(self.error)
        lay.addWidget(self.table, 1)
        details_card = QFrame(objectName="Card")
        dl = QVBoxLayout(details_card)
        dl.setContentsMargins(14, 10, 14, 10)
        dl.addWidget(self.details)
        lay.addWidget(details_card)
        lay.addLayout(self.downloads)

        service.table.modelReset.connect(self._update_summary)
        service.table.dataChanged.connect(self._update_summary)
        service.failed.connect(self._show_error)
        service.listed.connect(lambda _ids: self.error.hide())
        self._update_summary()

    def _update_summary(self, *_args) -> None:
        t = self.service.table
        vram = f" · GPU memory {human_bytes(t.vram_total_bytes)}" if t.vram_total_bytes else ""
        n = t.rowCount()
        self.summary.setText(f"{n} model{'s' if n != 1 else ''} · {human_bytes(t.total_bytes())} on disk on "
                             f"{self.service.target.describe()}{vram}")

    def _remember_selection(self) -> None:
        m = self.selected_model()
        self._selected_id = m.get("id", "") if m else ""

    def _restore_selection(self) -> None:
        models = self.service.table.models
        row = next((i for i, m in enumerate(models) if self._selected_id and m.get("id") == self._selected_id), -1)
        if row >= 0:
            self.table.selectRow(row)
        self._show_details()

    def _show_details(self, *_args) -> None:
        m = self.selected_model()
        if not m:
            self.details.setText(NO_SELECTION)
            return
        t = self.service.table
        fit, color = fit_hint(m, t.vram_total_bytes, t.gpu_share, t.no_gpu)
        parts = [f"<b style='color:#e6e9ef;'>{html.escape(display_name(m))}</b>",
                 html.escape(str(m.get("path", "")))]
        if m.get("memory_estimate_bytes"):
            ctx = m.get("estimate_context") or m.get("context_length")
            kv_dtype = str(m.get("estimate_kv_cache_dtype") or "auto")  # the Server panel's KV cache dtype
            kv = f"{' ' + kv_dtype if kv_dtype != 'auto' else ''} KV cache{f' at {ctx:,} tokens' if ctx else ''}"
            if m.get("kv_cache_bytes"):  # the pool serve's start log names (kv_sizing.plan_kv_pool)
                seqs = m.get("kv_cache_max_concurrency")
                kv = f" {human_bytes(m['kv_cache_bytes'])}{kv}{f' (x{seqs:g} full-length chats)' if seqs else ''}"
            parts.append(f"needs about {human_bytes(m['memory_estimate_bytes'])} "
                         f"(weights +{kv} + runtime, as "
                         f"`wslm models info` counts) · "
                         f"fits GPU: <span style='color:{color};'>{fit}</span>")
        if not m.get("supported", True):
            parts.append(f"<span style='color:#f85149;'>not supported: {html.escape(str(m.get('unsupported_reason')))}</span>")
        if m.get("complete") is False:
            parts.append("<span style='color:#d29922;'>incomplete download: pull it again to resume</span>")
        self.details.setText("<br>".join(parts))

    def shutdown(self, wait_ms: int = 3000) -> None:
        """App exit: cancel running downloads (they resume next time) and let them exit."""
        for job in self.jobs:
            if job.running:
                job.cancel()
                if job._proc:
                    job._proc.wait(wait_ms)

    NAME_SHARE = 0.3  # of the table's width, at least, for the names when the columns do not all fit

    def eventFilter(self, obj, event) -> bool:
        if obj is self.table and event.type() == QEvent.Type.Resize:
            QTimer.singleShot(0, self.fit_columns)  # once the table has laid out its viewport anew
        return super().eventFilter(obj, event)

    def fit_columns(self) -> None:
        """Each column as wide as its contents when they all fit, the name column taking the rest; on a
        narrow window the names keep at least NAME_SHARE of the width (cut in the middle) and the other
        columns share what is left, each cut to fit, rather than the names shrinking to "…"."""
        table, header = self.table, self.table.horizontalHeader()
        cols = table.model().columnCount()
        if not cols:
            return
        avail = table.viewport().width()
        want = [max(table.sizeHintForColumn(c), header.sectionSizeHint(c)) for c in range(cols)]
        if sum(want) > avail:  # short of room: a heading is cut before the values under it
            want = [max(table.sizeHintForColumn(c), 40) for c in range(cols)]
        rest = sum(want[1:])
        if want[0] + rest <= avail:
            widths = [avail - rest, *want[1:]]
        else:
            # The names keep at least NAME_SHARE; the other columns share the rest, the widest cut first (a
            # long architecture name), so the short ones (1B, gguf, Q4_K_M) stay whole.
            name = max(min(want[0], avail - rest), int(avail * self.NAME_SHARE))
            budget, others = max(0, avail - name), want[1:]
            low, high = 0, max(others)
            while low < high:  # the highest cap at which the others fit the budget
                mid = (low + high + 1) // 2
                low, high = (mid, high) if sum(min(w, mid) for w in others) <= budget else (low, mid - 1)
            widths = [name, *(min(w, low) for w in others)]
            widths[0] = max(name, avail - sum(widths[1:]))
        for c, w in enumerate(widths):
            header.resizeSection(c, w)

    def _show_error(self, text: str) -> None:
        self.error.setText(f"<span style='color:#f85149;'>⚠</span> {text}")
        self.error.show()

    def selected_model(self) -> dict | None:
        rows = self.table.selectionModel().selectedRows()
        return rows[0].data(ModelRole) if rows else None

    def _serve_selected(self) -> None:
        m = self.selected_model()
        if m:
            self.use_model.emit(m["id"])

    def _delete_selected(self, confirm: bool = True) -> None:
        m = self.selected_model()
        if not m:
            return
        if m.get("source") in ("demo", "bundled"):
            self._show_error(f"{m['id']} ships with wslm and cannot be deleted.")
            return
        if confirm and QMessageBox.question(
            self, "Delete model", f"Delete {m['id']} ({human_bytes(m.get('size_bytes'))}) from "
            f"{self.service.target.describe()}? This cannot be undone.") != QMessageBox.StandardButton.Yes:
            return
        self.service.remove(m["id"])

    # Downloads
    def make_job(self, repo: str, pattern: str, endpoint: str) -> PullJob:
        job = PullJob(self.service.target, repo, pattern, endpoint, self.service.logs, self)
        job.finished.connect(lambda state: self.service.refresh() if state == DONE else None)
        self.jobs.append(job)
        self.downloads.addWidget(DownloadProgressView(job, self))
        return job

    def set_endpoint(self, endpoint: str) -> None:
        if endpoint != self.hub_endpoint:
            self.hub_endpoint = endpoint
            self.endpoint_changed.emit(endpoint)

    def open_download(self) -> DownloadDialog:
        self.dialog = DownloadDialog(self.make_job, self.hub_endpoint, self)
        self.dialog.endpoint_used.connect(self.set_endpoint)
        self.dialog.show()
        return self.dialog

    def open_discover(self) -> DiscoverDialog:
        import psutil

        t = self.service.table
        self.discover = DiscoverDialog(self.service.target, self.hub_endpoint, t.vram_total_bytes, t.gpu_share,
                                       psutil.virtual_memory().total, self)
        self.discover.endpoint_changed.connect(self.set_endpoint)
        self.discover.download_requested.connect(lambda repo, pattern: self.make_job(repo, pattern,
                                                                                     self.discover.endpoint).start())
        self.discover.show()
        return self.discover
