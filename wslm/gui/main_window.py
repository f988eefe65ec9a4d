"""The main window: sidebar + stacked panels + status bar; owns the models and services, wires them."""

from __future__ import annotations

import base64
import logging

from PySide6.QtCore import QByteArray, Qt, QTimer
from PySide6.QtGui import QCloseEvent, QKeySequence, QShortcut
from PySide6.QtWidgets import QHBoxLayout, QMainWindow, QStackedWidget, QWidget

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm.gui.backend_target import target_from_settings, target_label, target_to_settings
from wslm.gui.chat_panel import ChatPanel
from wslm.gui.chat_session import ChatSession
from wslm.gui.chat_store import ChatStore
from wslm.gui.first_run import FirstRunDialog
from wslm.gui.log_model import LogModel
from wslm.gui.logs_panel import LogsPanel
from wslm.gui.models_panel import ModelsPanel
from wslm.gui.models_service import ModelsService
from wslm.gui.resource_monitor import ResourceMonitor
from wslm.gui.server_controller import READY, ServerController
from wslm.gui.server_panel import ServerPanel
from wslm.gui.settings import Settings, load_settings, save_settings
from wslm.gui.share_panel import SharePanel
from wslm.gui.share_service import ShareService
from wslm.gui.sidebar import PANELS, Sidebar
from wslm.gui.status_bar import StatusBar
from wslm.wsl_bridge.launcher import Target

log = logging.getLogger(__name__)

SERVER_NOT_RUNNING = ("The server is not running: start it in the Server panel; it will listen on the LAN and "
                      "require this API key.")


class MainWindow(QMainWindow):
    def __init__(self, settings: Settings | None = None, store: ChatStore | None = None,
                 watch: bool = True) -> None:
        """`watch`: start the periodic monitors (resources, share status); off for screenshots/tests."""
        super().__init__()
        self.setWindowTitle("wslm")
        self.settings = settings or load_settings()
        s = self.settings
        self.target = target_from_settings(s.target)
        self.logs = LogModel(parent=self)
        self._own_store = store is None
        self.store = store or ChatStore()
        self.session = ChatSession(self.store, {"system_prompt": s.system_prompt, "temperature": s.temperature,
                                                "top_p": s.top_p, "max_tokens": s.max_tokens}, self)
        self.server = ServerController(self.logs, self)
        self.server.target = self.target
        self.server.auto_restart = s.auto_restart
        self.models = ModelsService(self.logs, self)
        self.models.target = self.target
        self.share = ShareService(self)
        self.share.port = s.port
        self.share.distro = self.target.distro if self.target.via_wsl else None
        self.monitor = ResourceMonitor(parent=self)
        self.monitor.set_target(self.target)

        self.chat_panel = ChatPanel(self.session, s)
        self.models_panel = ModelsPanel(self.models, s.hub_endpoint)
        self.server_panel = ServerPanel(self.server, s)
        self.share_panel = SharePanel(self.share)
        self.logs_panel = LogsPanel(self.logs)
        self.panels: dict[str, QWidget] = {"chat": self.chat_panel, "models": self.models_panel,
                                           "server": self.server_panel, "share": self.share_panel,
                                           "logs": self.logs_panel}
        self.stack = QStackedWidget()
        for key, _icon, _label in PANELS:
            self.stack.addWidget(self.panels[key])
        self.sidebar = Sidebar()
        self.sidebar.selected.connect(self.show_panel)
        central = QWidget()
        lay = QHBoxLayout(central)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(0)
        lay.addWidget(self.sidebar)
        lay.addWidget(self.stack, 1)
        self.setCentralWidget(central)
        self.status = StatusBar(self)
        self.setStatusBar(self.status)

        self._wire()
        self._shortcuts()
        self._restore_geometry()
        self.sidebar.select(s.last_panel if s.last_panel in self.panels else "chat")
        self.models.refresh()
        if watch:
            self.monitor.start()
            QTimer.singleShot(500, self._watch_share)

    # Wiring
    def _wire(self) -> None:
        for panel in (self.chat_panel, self.server_panel):
            panel.settings_changed.connect(self.save)
        self.server.state_changed.connect(self._on_server_state)
        self.server.ready.connect(self._on_server_ready)
        self.server.metrics_updated.connect(self._on_metrics)
        self.server_panel.change_target.connect(self.choose_target)
        self.models.listed.connect(self.server_panel.set_models)
        self.models_panel.use_model.connect(self._serve_model)
        self.monitor.sample.connect(self.server_panel.show_resources)
        self.monitor.gpu_sample.connect(self.server_panel.show_gpu)
        self.monitor.gpu_sample.connect(self._on_gpu)
        self.monitor.gpu_unavailable.connect(self.server_panel.gpu_unavailable)
        self.monitor.gpu_unavailable.connect(lambda _why: self.models.table.set_vram(None, no_gpu=True))
        self.session.reply_finished.connect(lambda st: self.status.set_speed(st.get("tokens_per_s")))
        self.share_panel.server_change.connect(self._on_share_server)
        self.share.result.connect(lambda r: self._on_share_off() if r.get("action") == "off" else None)
        self._on_server_state(self.server.state, "")

    def _shortcuts(self) -> None:
        """Ctrl+1..5: panels; Ctrl+N: new chat; Esc: stop the reply."""
        for i, (key, _icon, _label) in enumerate(PANELS, start=1):
            QShortcut(QKeySequence(f"Ctrl+{i}"), self, activated=lambda k=key: self.sidebar.select(k))
        QShortcut(QKeySequence("Ctrl+N"), self, activated=lambda: (self.sidebar.select("chat"),
                                                                  self.chat_panel.new_chat()))
        QShortcut(QKeySequence(Qt.Key.Key_Escape), self, activated=self.session.stop)

    def _watch_share(self) -> None:
        from wslm.wsl_bridge import winexec

        if winexec.is_windows():
            self.share.poll()
            self.share.start_watching()
        else:
            self.share_panel._set_notes([("LAN sharing is for Windows with WSL: on Linux, start the server with "
                                          "host 0.0.0.0 and an API key instead.", "#8d96a8")])

    def show_panel(self, key: str) -> None:
        if key in self.panels:
            self.stack.setCurrentWidget(self.panels[key])
            self.settings.last_panel = key

    def _on_server_state(self, state: str, _detail: str) -> None:
        self.status.set_state(state, target_label(self.target))
        model = self.server.ready_event.get("model") or self.server.config.model
        self.setWindowTitle(f"wslm — {model}" if state == READY else f"wslm — server {state}")
        self.status.set_model((self.server.ready_event.get("model") or self.server.config.model) if state == READY else "")
        if state != READY:
            self.chat_panel.set_server("", "", "")
            self.status.set_kv(None)

    def _on_server_ready(self, event: dict) -> None:
        self.share_panel.remove_note(SERVER_NOT_RUNNING)
        self.chat_panel.set_server(self.server.base_url, str(event.get("model") or self.server.config.model),
                                   self.server.config.api_key)

    def _on_metrics(self, m: dict) -> None:
        self.status.set_kv(m.get("kv_cache_usage"))
        if m.get("tokens_per_s"):
            self.status.set_speed(m["tokens_per_s"])

    def _on_gpu(self, g: dict) -> None:
        self.models.table.set_vram(int(g["vram_total_mib"] * 2**20), self.settings.gpu_memory_utilization)

    def _serve_model(self, model_id: str) -> None:
        self.server_panel.model.setCurrentText(model_id)
        self.sidebar.select("server")

    def _on_share_off(self) -> None:
        """Share off: back to loopback only; a backend listening on the LAN restarts on 127.0.0.1."""
        if self.settings.host == "127.0.0.1":
            return
        self.settings.host = "127.0.0.1"
        self.save()
        if self.server.running and self.server.config.host != "127.0.0.1":
            self.server_panel.restart()

    def _on_share_server(self, server: dict) -> None:
        """Share on: the backend must listen on 0.0.0.0 with the share's API key."""
        self.settings.host = str(server.get("host") or "0.0.0.0")
        key = server.get("api_key") or ""
        if key:
            self.settings.api_key = key
            self.server_panel.api_key.setText(key)
            self.server_panel.api_key.setCursorPosition(0)
        self.save()
        if self.server.running and (server.get("restart_required") or self.server.config.host != self.settings.host):
            self.server_panel.restart()
        elif not self.server.running:
            self.share_panel.add_note(SERVER_NOT_RUNNING)

    # Target
    def choose_target(self) -> None:
        dialog = FirstRunDialog(self.target, self)
        if dialog.exec() and dialog.chosen is not None:
            self.set_target(dialog.chosen)
        self.settings.first_run_done = True
        self.save()

    def set_target(self, target: Target) -> None:
        self.target = target
        self.settings.target = target_to_settings(target)
        self.server.target = target
        self.models.target = target
        self.monitor.set_target(target)
        self.share.distro = target.distro if target.via_wsl else None
        self.server_panel.set_target_label()
        self.models.refresh()

    def maybe_first_run(self) -> None:
        if not self.settings.first_run_done:
            QTimer.singleShot(0, self.choose_target)

    # Persistence
    def _restore_geometry(self) -> None:
        raw = self.settings.window_geometry
        if raw:
            try:
                if self.restoreGeometry(QByteArray(base64.b64decode(raw))):
                    return
            except ValueError:
                pass
        self.resize(1280, 800)

    def save(self) -> None:
        self.settings.window_geometry = base64.b64encode(bytes(self.saveGeometry().data())).decode()
        try:
            save_settings(self.settings)
        except OSError as exc:
            log.warning("could not save settings: %s", exc)

    def closeEvent(self, event: QCloseEvent) -> None:
        self.save()
        self.monitor.stop()
        self.share.stop_watching()
        self.session.shutdown()
        self.models_panel.shutdown()
        self.server.shutdown()
        if self._own_store:
            self.store.close()
        super().closeEvent(event)
