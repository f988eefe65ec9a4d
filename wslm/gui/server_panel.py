"""Server panel: target, model, port, context, GPU share, API key; Start/Stop/Restart; state, plots, log."""

from __future__ import annotations

import html
import shlex

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm.embed_model import EMBED_NAME
from wslm.gui import theme
from wslm.gui.api_key_field import ApiKeyField
from wslm.gui.backend_target import target_label
from wslm.gui.engine_options import (
    KV_CACHE_DTYPES,
    QUANTIZATIONS,
    check_kv_cache_dtype,
    check_quantization,
    check_tensor_parallel,
    fitting_tp_sizes,
    quantization_choices,
)
from wslm.gui.log_view import LogView
from wslm.gui.models_model import display_name
from wslm.gui.optional_spin import OptionalSpinBox
from wslm.gui.plot_widget import Sparkline
from wslm.gui.server_controller import CRASHED, READY, STARTING, STOPPED, ServerConfig, ServerController
from wslm.gui.settings import Settings
from wslm.gui.speculative_box import SpeculativeBox

CRASH_LINES = 6  # log lines quoted in the crash box; the full log stays below it

STATE_TEXT = {"stopped": "Stopped", "starting": "Starting", "loading": "Loading model", "ready": "Ready",
              "stopping": "Stopping", "crashed": "Crashed"}
FAILED_TO_START = "Failed to start"  # "crashed" before it was ever ready: it did not crash, it never ran


class ServerPanel(QWidget):
    change_target = Signal()
    settings_changed = Signal()
    notice = Signal(str)  # a brief word for the status bar ("API key copied")

    def __init__(self, controller: ServerController, settings: Settings, parent=None) -> None:
        super().__init__(parent)
        self.controller = controller
        self.settings = settings
        self.models: list[dict] = []  # `models list` entries: what the engine options are checked against
        self.was_ready = False  # this run reached ready (a crash before it is a failure to start)

        title = QLabel("Server", objectName="Title")
        self.badge = QLabel(objectName="StateBadge")
        self.detail = QLabel(objectName="Muted")
        self.detail.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.detail.setMinimumWidth(1)  # a long detail must not set the window's minimum width
        self.start_button = QPushButton("▶  Start", objectName="Primary")
        self.stop_button = QPushButton("■  Stop")
        self.restart_button = QPushButton("↻  Restart")
        self.start_button.clicked.connect(self.start)
        self.stop_button.clicked.connect(controller.stop)
        self.restart_button.clicked.connect(self.restart)
        head = QHBoxLayout()
        head.addWidget(title)
        head.addSpacing(8)
        head.addWidget(self.badge)
        head.addSpacing(8)
        head.addWidget(self.detail, 1)
        for b in (self.restart_button, self.stop_button, self.start_button):
            head.addWidget(b)

        form_card = QFrame(objectName="Card")
        grid = QGridLayout(form_card)
        grid.setContentsMargins(12, 12, 12, 12)
        grid.setHorizontalSpacing(10)
        self.target_label = QLabel()
        change = QPushButton("Change…")
        change.clicked.connect(self.change_target)
        target_row = QHBoxLayout()
        target_row.addWidget(self.target_label, 1)
        target_row.addWidget(change)
        # Installed models (`wslm models list`), shown by the names users know; the item data is the id
        # `wslm serve --model` takes. Not free text: a typo would only show up as a crash.
        self.model = QComboBox()
        self.model.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.model.setMinimumContentsLength(10)
        self.set_model(settings.model or "demo")
        self.port = QSpinBox(minimum=1, maximum=65535, value=settings.port)
        self.context = OptionalSpinBox(minimum=0, maximum=1048576, singleStep=1024, value=settings.max_model_len)
        self.context.setSpecialValueText("model default")
        self.gpu = QDoubleSpinBox(minimum=0.05, maximum=0.99, singleStep=0.05, decimals=2,
                                  value=settings.gpu_memory_utilization)
        self.gpu.setToolTip("Share of GPU memory the engine may use for weights and KV cache (--gpu-memory-utilization)")
        # Masked, with Show / Copy / Generate: a masked field alone copies nothing on Ctrl+C (issue 34, bug 3).
        self.api_key_field = ApiKeyField(settings.api_key)
        self.api_key = self.api_key_field.edit
        self.api_key_field.copied.connect(self.notice)
        self.extra = QLineEdit(settings.serve_extra_args, placeholderText="more wslm serve flags, e.g. --max-num-seqs 8")
        self.extra.editingFinished.connect(self._save)
        self.auto_restart = QCheckBox("Restart automatically if it crashes")
        self.auto_restart.setChecked(settings.auto_restart)
        self.auto_restart.toggled.connect(self._save)
        self.start_on_launch = QCheckBox("Start the server when wslm opens")
        self.start_on_launch.setToolTip("Load the model above as soon as the app opens, so the chat is ready")
        self.start_on_launch.setChecked(settings.start_server_on_launch)
        self.start_on_launch.toggled.connect(self._save)
        self.model_pool = QCheckBox("Switch models without restarting")
        self.model_pool.setToolTip(
            "--model-pool all: picking another installed model in the chat loads it beside this one instead of "
            "restarting the server (two models loaded at most; on a GPU each gets half of the GPU memory share). "
            "Takes effect at the next start.")
        self.model_pool.setChecked(settings.model_pool)
        self.model_pool.toggled.connect(self._save)
        # Engine options (vLLM's flags), offered with the values that fit; checked before a start.
        self.quantization = QComboBox()
        for label, value in QUANTIZATIONS:
            self.quantization.addItem(label, value)
        self.quantization.setCurrentIndex(max(0, self.quantization.findData(settings.quantization)))
        self.quantization.setToolTip("--quantization: how the weights are stored in memory")
        self.kv_dtype = QComboBox()
        for label, value in KV_CACHE_DTYPES:
            self.kv_dtype.addItem(label, value)
        self.kv_dtype.setCurrentIndex(max(0, self.kv_dtype.findData(settings.kv_cache_dtype)))
        self.kv_dtype.setToolTip("--kv-cache-dtype")
        self.tp = QComboBox()
        self.tp.setToolTip("--tensor-parallel-size: split the model over several GPUs")
        self.tp_label = QLabel("Tensor parallel", objectName="Muted")
        self.gpu_count = 0  # from nvidia-smi on the target; the TP field shows with 2 or more
        self.has_gpu: bool | None = None
        self._fill_tp()
        rows = [("Target", target_row), ("Model", self.model), ("Port", self.port), ("Context length", self.context),
                ("GPU memory share", self.gpu), ("Quantization", self.quantization),
                ("KV cache dtype", self.kv_dtype), (self.tp_label, self.tp)]
        for combo in (self.quantization, self.kv_dtype, self.tp):
            combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
            combo.setMinimumContentsLength(7)
        for i, (label, w) in enumerate(rows):
            r, c = i // 2, (i % 2) * 2  # two label/field pairs a row: fits a narrow window
            grid.addWidget(label if isinstance(label, QLabel) else QLabel(label, objectName="Muted"), r, c)
            if isinstance(w, QHBoxLayout):
                grid.addLayout(w, r, c + 1)
            else:
                grid.addWidget(w, r, c + 1)
        # The key and its three buttons get a whole row: in half of one they set the window's minimum width.
        grid.addWidget(QLabel("API key", objectName="Muted"), 4, 0)
        grid.addWidget(self.api_key_field, 4, 1, 1, 3)
        grid.addWidget(QLabel("Extra flags", objectName="Muted"), 5, 0)
        grid.addWidget(self.extra, 5, 1)
        grid.addWidget(self.auto_restart, 5, 2, 1, 2)
        grid.addWidget(self.model_pool, 6, 0, 1, 2)
        grid.addWidget(self.start_on_launch, 6, 2, 1, 2)
        # Speculative decoding (LM Studio's switch and draft picker): --speculative-config at the next start.
        self.speculative = SpeculativeBox(settings.speculative_decoding, settings.speculative_draft)
        self.speculative.changed.connect(self._save)
        grid.addWidget(self.speculative, 7, 0, 1, 4)
        for w in (self.quantization, self.kv_dtype, self.tp):
            w.currentIndexChanged.connect(self._save)
        grid.setColumnStretch(1, 1)
        grid.setColumnStretch(3, 1)
        for w in (self.port, self.context, self.gpu):
            w.valueChanged.connect(self._save)
        # Another model splits differently: offer its tensor-parallel sizes (before _save stores the choice).
        self.model.currentIndexChanged.connect(lambda _i: self._fill_tp())
        self.model.currentIndexChanged.connect(
            lambda _i: self.speculative.set_models(self.models, main=self.model_id()))  # not its own draft
        self.model.currentIndexChanged.connect(self._save)
        self.api_key_field.edited.connect(self._save)
        # Changing the field the crash card points at answers it: the card goes (it would go stale).
        for name, changed in (("model", self.model.currentIndexChanged), ("port", self.port.valueChanged),
                              ("context", self.context.valueChanged), ("gpu", self.gpu.valueChanged),
                              ("api_key", self.api_key.textEdited), ("extra", self.extra.textEdited),
                              ("quantization", self.quantization.currentIndexChanged),
                              ("kv_dtype", self.kv_dtype.currentIndexChanged), ("tp", self.tp.currentIndexChanged),
                              ("speculative", self.speculative.changed)):
            changed.connect(lambda *_a, n=name: self._field_edited(n))

        self.crash_box = QLabel()
        self.crash_box.setWordWrap(True)
        self.crash_box.setTextFormat(Qt.TextFormat.RichText)
        self.crash_box.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.crash_box.setStyleSheet("background-color: #2a1517; border: 1px solid #5c2a2d; border-radius: 10px; padding: 10px;")
        self.crash_box.hide()
        # The ready event's `warning` (reachable from the LAN with no API key), in the app's words.
        self.warning_box = QLabel(wordWrap=True)
        self.warning_box.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.warning_box.setStyleSheet(f"color: {theme.WARN}; border: 1px solid {theme.WARN}; border-radius: 10px;"
                                       " padding: 10px;")
        self.warning_box.hide()

        plots = QGridLayout()
        plots.setSpacing(10)
        self.plots = {
            "cpu": Sparkline("CPU", "%", 100, "#4f9dff"),
            "ram": Sparkline("RAM", "%", 100, "#a371f7"),
            "gpu": Sparkline("GPU", "%", 100, "#3fb950"),
            "vram": Sparkline("VRAM", "%", 100, "#2ea043"),
            "kv": Sparkline("KV cache", "%", 100, "#d29922"),
            "tps": Sparkline("Throughput", " tok/s", None, "#f778ba"),
        }
        for i, plot in enumerate(self.plots.values()):
            plots.addWidget(plot, i // 3, i % 3)  # two rows of three: fits a narrow window

        self.log = LogView(controller.logs, only="server")
        self.log.setMinimumHeight(150)  # a crash box above must not squeeze the log to a few lines
        lay = QVBoxLayout(self)
        lay.setContentsMargins(12, 14, 12, 14)
        lay.setSpacing(12)
        lay.addLayout(head)
        lay.addWidget(form_card)
        lay.addWidget(self.crash_box)
        lay.addWidget(self.warning_box)
        lay.addLayout(plots)
        log_title = QLabel("Server log", objectName="Muted")
        lay.addWidget(log_title)
        lay.addWidget(self.log, 1)

        controller.state_changed.connect(self.show_state)
        controller.metrics_updated.connect(self.show_metrics)
        controller.health_changed.connect(self._on_health)
        controller.ready.connect(self.show_ready)
        self.show_state(controller.state, controller.detail)
        self.set_target_label()

    def set_target_label(self) -> None:
        self.target_label.setText(target_label(self.controller.target))

    def set_models(self, models: list) -> None:
        """Fill the picker from `models list` (dicts, or bare ids); the chosen model stays chosen."""
        current = self.model_id()
        self.models = [m for m in models if isinstance(m, dict)]
        self.model.blockSignals(True)
        self.model.clear()
        for m in models or ["demo"]:
            model_id = m.get("id", "") if isinstance(m, dict) else str(m)
            if model_id:
                label = display_name(m) if isinstance(m, dict) else model_id
                self.model.addItem(label if label == model_id else f"{label}  ({model_id})", model_id)
        self.model.blockSignals(False)
        self.set_model(current or "demo")
        self._fill_tp()
        self._fill_quantizations()
        self.speculative.set_models(self.models, main=self.model_id())

    def _fill_quantizations(self) -> None:
        """Formats the backend registers beyond QUANTIZATIONS (its models list's options) join the field."""
        self.quantization.blockSignals(True)
        for label, value in quantization_choices(self.models):
            if self.quantization.findData(value) < 0:
                self.quantization.addItem(label, value)
        self.quantization.blockSignals(False)

    def model_id(self) -> str:
        return str(self.model.currentData() or self.model.currentText()).strip()

    def set_model(self, model_id: str) -> None:
        """Select `model_id`; one not (yet) listed is added, marked, so a saved choice is never lost."""
        i = self.model.findData(model_id)
        if i < 0:
            self.model.addItem(model_id if model_id == "demo" or not self.model.count() else
                               f"{model_id}  (not in `models list`)", model_id)
            i = self.model.count() - 1
        self.model.setCurrentIndex(i)

    def reload(self) -> None:
        """Show what the Settings dialog changed in the shared settings (model, API key, start on launch),
        without treating it as an edit here; then announce it once, as an edit would."""
        s = self.settings
        for w in (self.model, self.start_on_launch, self.api_key):
            w.blockSignals(True)
        try:
            self.set_model(s.model or "demo")
            self.start_on_launch.setChecked(s.start_server_on_launch)
            self.api_key_field.set_text(s.api_key)
        finally:
            for w in (self.model, self.start_on_launch, self.api_key):
                w.blockSignals(False)
        self.api_key_field.copy_button.setEnabled(bool(s.api_key))
        self._fill_tp()
        self._save()

    def extra_args(self) -> list[str] | None:
        """The extra flags split like a shell would; None (and a message) when the quoting is broken."""
        try:
            return shlex.split(self.extra.text())
        except ValueError as exc:
            self.detail.setText(f"⚠ Extra flags: {exc}")
            return None

    def config(self) -> ServerConfig:
        return ServerConfig(model=self.model_id() or "demo", host=self.settings.host,
                            port=self.port.value(), api_key=self.api_key.text().strip(),
                            max_model_len=self.context.value(), gpu_memory_utilization=self.gpu.value(),
                            quantization=str(self.quantization.currentData() or ""),
                            kv_cache_dtype=str(self.kv_dtype.currentData() or "auto"),
                            tensor_parallel_size=int(self.tp.currentData() or 1),
                            model_pool=self._pool(),
                            extra_args=self.extra_args() or [],
                            speculative_config=self.speculative.config_json())

    def _pool(self) -> list[str]:
        """--model-pool: every installed model ("Switch models without restarting"), else the shipped
        embedding model alone when it is installed, so attached documents are embedded by this server."""
        if self.model_pool.isChecked():
            return ["all"]
        shipped = any(m.get("id") == EMBED_NAME for m in self.models)
        return [EMBED_NAME] if shipped and self.model_id() != EMBED_NAME else []

    def _save(self, *_args) -> None:
        s = self.settings
        s.model, s.port, s.max_model_len = self.model_id() or "demo", self.port.value(), self.context.value()
        s.gpu_memory_utilization, s.api_key = self.gpu.value(), self.api_key.text().strip()
        s.auto_restart = self.auto_restart.isChecked()
        s.start_server_on_launch = self.start_on_launch.isChecked()
        s.model_pool = self.model_pool.isChecked()
        s.quantization = str(self.quantization.currentData() or "")
        s.kv_cache_dtype = str(self.kv_dtype.currentData() or "auto")
        s.tensor_parallel_size = int(self.tp.currentData() or 1)
        s.serve_extra_args = self.extra.text().strip()
        s.speculative_decoding, s.speculative_draft = self.speculative.enabled(), self.speculative.draft_id()
        self.controller.auto_restart = s.auto_restart
        self.settings_changed.emit()

    def start(self) -> None:
        self._save()
        if self.extra_args() is None or not self.validate():
            return
        self.controller.start(self.config())

    # Engine options
    def selected_model(self) -> dict | None:
        return next((m for m in self.models if m.get("id") == self.model_id()), None)

    def validate(self) -> bool:
        """Check the engine options against the model and the target; say what to change, before a start."""
        model = self.selected_model()
        problems = [(check_quantization(str(self.quantization.currentData() or ""), model), "quantization"),
                    (check_kv_cache_dtype(str(self.kv_dtype.currentData() or "auto"), self.has_gpu), "kv_dtype"),
                    (check_tensor_parallel(int(self.tp.currentData() or 1), self.gpu_count, model), "tp")]
        problem = next(((text, name) for text, name in problems if text), None)
        self._mark_field(problem[1] if problem else "")
        if problem:
            self.detail.setText(f"⚠ {problem[0]}")
            self.detail.setToolTip(problem[0])
        return problem is None

    def set_gpu_count(self, count: int) -> None:
        self.gpu_count = int(count)
        self.has_gpu = count > 0
        self._fill_tp()

    def _fill_tp(self) -> None:
        chosen = int(self.tp.currentData() or self.settings.tensor_parallel_size or 1)
        sizes = fitting_tp_sizes(self.gpu_count, self.selected_model()) if self.gpu_count > 1 else [1]
        self.tp.blockSignals(True)
        self.tp.clear()
        for n in sizes:
            self.tp.addItem(f"{n} GPU{'s' if n > 1 else ''}", n)
        self.tp.setCurrentIndex(max(0, self.tp.findData(chosen)))
        self.tp.blockSignals(False)
        several = self.gpu_count > 1
        self.tp.setVisible(several)
        self.tp_label.setVisible(several)

    def restart(self) -> None:
        self._save()
        self.controller.config = self.config()
        self.controller.restart()

    def state_text(self, state: str) -> str:
        """The state in words: a crash before the server was ever ready is a failure to start."""
        return FAILED_TO_START if state == CRASHED and not self.was_ready else STATE_TEXT.get(state, state)

    def _field_edited(self, name: str) -> None:
        if self.controller.state == READY and name != "model":  # a model switch has its own progress
            # The running server keeps the settings it started with: say so, not silently nothing.
            self.detail.setText("Changed while serving: ↻ Restart to apply")
            self.detail.setToolTip("The server keeps the settings it started with until it restarts")
        cause = self.controller.cause
        if self.controller.state == CRASHED and cause and cause.field == name and not self.crash_box.isHidden():
            self.crash_box.hide()
            self._mark_field("", focus=False)
            self.detail.setText(f"{cause.title}: changed, Start to try again")

    def show_state(self, state: str, detail: str) -> None:
        if state in (STARTING, READY):
            self.was_ready = state == READY
        self.badge.setText(self.state_text(state))
        self.badge.setStyleSheet(theme.badge_style(state))
        running = self.controller.running
        self.start_button.setEnabled(not running)
        self.stop_button.setEnabled(running and state != "stopping")
        self.restart_button.setEnabled(state in (READY, CRASHED, "loading", "starting"))
        self.detail.setText(detail if state != CRASHED else "See below for the cause")
        self._mark_field("")
        if state == CRASHED:
            cause = self.controller.cause
            title = cause.title if cause else "The server stopped unexpectedly"
            said = detail.removeprefix(title + ". ")
            if not self.was_ready and title == "The server stopped unexpectedly":
                title = "The server failed to start"
            # A recognised cause is said in the app's words; the raw lines (with their command-line advice)
            # stay in the log below. Otherwise this run's last lines are the best explanation there is.
            quoted = [] if cause and cause.field else self.controller.last_lines[-CRASH_LINES:]
            lines = "<br>".join(html.escape(x) for x in quoted)
            self.crash_box.setText(
                f"<b style='color:{theme.ERROR};'>{html.escape(title)}</b><br>{html.escape(said)}"
                + (f"<br><br><span style='font-family:monospace; color:#d8b4b1;'>{lines}</span>" if lines else ""))
            self.crash_box.show()
            if cause:
                self._mark_field(cause.field)
        elif state != STOPPED:
            self.crash_box.hide()
        if state != READY:
            self.warning_box.hide()
            # Nothing is served: no stale "80 tokens generated" beside "when the server is ready".
            for key in ("kv", "tps"):
                self.plots[key].clear()
                self.plots[key].set_note("when the server is ready")

    def show_ready(self, event: dict) -> None:
        """Say the server's own warning where the user can act on it: the API key field, not a flag."""
        if not event.get("warning"):
            self.warning_box.hide()
            return
        host, port = event.get("host", ""), event.get("port", "")
        self.warning_box.setText(
            f"⚠ Reachable from other machines ({host}:{port}) with no API key: anyone who can reach this port "
            "can use the model. Set a key in the “API key” field (Generate) and restart, or share it through "
            "the Share panel, which sets a key for you.")
        self.warning_box.setToolTip(str(event["warning"]))  # the server's own words, flags and all
        self.warning_box.show()
        self._mark_field("api_key", focus=False)

    def _mark_field(self, name: str, focus: bool = True) -> None:
        """Outline the field the crash box tells the user to change (and put the cursor there)."""
        fields = {"model": self.model, "port": self.port, "context": self.context, "gpu": self.gpu,
                  "api_key": self.api_key, "extra": self.extra, "quantization": self.quantization,
                  "kv_dtype": self.kv_dtype, "tp": self.tp, "speculative": self.speculative.draft}
        for key, w in fields.items():
            w.setStyleSheet(f"border: 1px solid {theme.ERROR};" if key == name else "")
        if name in fields and focus:
            fields[name].setFocus()

    def show_metrics(self, m: dict) -> None:
        self.plots["kv"].add(100.0 * (m.get("kv_cache_usage") or 0.0),
                             f"{int(m.get('running') or 0)} running · {int(m.get('waiting') or 0)} waiting")
        rate = m.get("tokens_per_s")
        if rate is not None:
            self.plots["tps"].add(rate, f"{int(m.get('generation_tokens_total') or 0):,} tokens generated")

    def show_resources(self, s: dict) -> None:
        self.plots["cpu"].add(s["cpu"])
        self.plots["ram"].add(s["ram"], f"{s['ram_used_gib']:.1f} / {s['ram_total_gib']:.1f} GiB")

    def show_gpu(self, g: dict) -> None:
        if g.get("gpu_count") is not None and g["gpu_count"] != self.gpu_count:
            self.set_gpu_count(int(g["gpu_count"]))
        self.plots["gpu"].add(g["gpu_util"], g.get("gpu_name", ""))
        total = g["vram_total_mib"] or 1
        self.plots["vram"].add(100.0 * g["vram_used_mib"] / total,
                               f"{g['vram_used_mib'] / 1024:.1f} / {total / 1024:.1f} GiB")

    def gpu_unavailable(self, why: str) -> None:
        self.set_gpu_count(0)
        self.plots["gpu"].set_note(why)
        self.plots["vram"].set_note("no GPU data")

    def _on_health(self, status: str) -> None:
        if status != "ok" and self.controller.state == READY:
            self.detail.setText(f"⚠ /health: {status}")
        elif self.controller.state == READY:
            self.detail.setText(self.controller.detail)
