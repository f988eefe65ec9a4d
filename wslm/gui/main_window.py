"""The main window: sidebar + stacked panels + status bar; owns the models and services, wires them."""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QByteArray, Qt, QTimer
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QApplication,
    QHBoxLayout,
    QMainWindow,
    QMenu,
    QMessageBox,
    QStackedWidget,
    QSystemTrayIcon,
    QWidget,
)

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm.gui.backend_target import target_from_settings, target_label, target_to_settings
from wslm.gui.chat_panel import ChatPanel
from wslm.gui.chat_session import ChatSession
from wslm.gui.chat_store import ChatStore
from wslm.gui.first_run import FirstRunDialog, _linux_path
from wslm.gui.log_model import LogModel
from wslm.gui.logs_panel import LogsPanel
from wslm.gui.mcp_chat import connect_chat
from wslm.gui.mcp_page import McpPage
from wslm.gui.mcp_service import McpService
from wslm.gui.models_folder import apply_models_dir
from wslm.gui.models_panel import ModelsPanel
from wslm.gui.models_service import ModelsService, kv_estimate_args
from wslm.gui.pool_client import ModelPoolClient
from wslm.gui.resource_monitor import ResourceMonitor
from wslm.gui.scroll_page import ScrollPage
from wslm.gui.server_controller import CRASHED, LOADING, READY, STARTING, STOPPED, STOPPING, ServerController
from wslm.gui.server_panel import ServerPanel
from wslm.gui.settings import Settings, load_settings, save_settings
from wslm.gui.settings_dialog import SettingsDialog
from wslm.gui.share_panel import SharePanel
from wslm.gui.share_service import ShareService
from wslm.gui.sidebar import PANELS, Sidebar
from wslm.gui.status_bar import StatusBar
from wslm.gui.theme import apply_theme, current_theme
from wslm.wsl_bridge.launcher import Target

log = logging.getLogger(__name__)

SERVER_NOT_RUNNING = ("The server is not running: start it in the Server panel; it will listen on the LAN and "
                      "require this API key.")


MIN_WIDTH = 800


class MainWindow(QMainWindow):
    def __init__(self, settings: Settings | None = None, store: ChatStore | None = None,
                 watch: bool = True) -> None:
        """`watch`: start the periodic monitors (resources, share status); off for screenshots/tests."""
        super().__init__()
        self.setWindowTitle("wslm")
        self.settings = settings or load_settings()
        s = self.settings
        apply_models_dir(s.models_dir)  # before the first `models list`: every wslm the app starts gets it
        self.target = target_from_settings(s.target)
        # More Settings pages, (title, make the page's widget): the MCP page, say. Made each time it opens.
        self.settings_pages: list[tuple[str, Callable[[], QWidget]]] = []
        self.settings_dialog: SettingsDialog | None = None
        self.logs = LogModel(parent=self)
        self._own_store = store is None
        self._switching_to = ""  # the model a switch from the Chat panel is loading
        self.quit_ends_app = watch  # the real app; tests and screenshots share their QApplication
        self.store = store or ChatStore()
        self.session = ChatSession(self.store, {"system_prompt": s.system_prompt, "temperature": s.temperature,
                                                "top_p": s.top_p, "max_tokens": s.max_tokens}, self)
        self.server = ServerController(self.logs, self)
        self.server.target = self.target
        self.server.auto_restart = s.auto_restart
        self.pool = ModelPoolClient(self)  # the running server's other models (--model-pool): switch without restart
        self.models = ModelsService(self.logs, self)
        self.models.target = self.target
        self.models.context = s.max_model_len
        self.models.kv_args = kv_estimate_args(s.kv_cache_dtype, s.serve_extra_args, _draft(s))
        self.share = ShareService(self)
        self.share.port = s.port
        self.share.distro = self.target.distro if self.target.via_wsl else None
        self.monitor = ResourceMonitor(parent=self)
        self.monitor.set_target(self.target)

        self.chat_panel = ChatPanel(self.session, s)
        # MCP servers (mcp.json): their tools offered in chats, each call confirmed (docs/mcp.md).
        self.mcp = McpService(parent=self)
        connect_chat(self, self.session, self.chat_panel.view, self.mcp)
        self._mcp_page: McpPage | None = None
        self.settings_pages.append(("MCP", lambda: McpPage(self.mcp)))  # Settings → MCP: the same page
        self.chat_panel.server_path = self._server_path
        self.chat_panel.live_switch = self._live_switch
        self.chat_panel.can_eject = self._can_eject
        self.models_panel = ModelsPanel(self.models, s.hub_endpoint)
        self.server_panel = ServerPanel(self.server, s)
        self.share_panel = SharePanel(self.share)
        self.logs_panel = LogsPanel(self.logs)
        self.panels: dict[str, QWidget] = {"chat": self.chat_panel, "models": self.models_panel,
                                           "server": self.server_panel, "share": self.share_panel,
                                           "logs": self.logs_panel}
        self.stack = QStackedWidget()
        # The tall panels scroll on a small screen rather than making the window taller than it (issue 24).
        self.pages: dict[str, QWidget] = {k: ScrollPage(p) if k in ("server", "share") else p
                                          for k, p in self.panels.items()}
        for key, _icon, _label in PANELS:
            self.stack.addWidget(self.pages[key])
        self.sidebar = Sidebar()
        self.sidebar.selected.connect(self.show_panel)
        central = QWidget()
        lay = QHBoxLayout(central)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(0)
        lay.addWidget(self.sidebar)
        lay.addWidget(self.stack, 1)
        self.setCentralWidget(central)
        # The widest panel sets the minimum width (the Server panel's form, ~800 px); the Chat panel's header
        # needs about that much to show a chat title's first words, whichever panel happens to be widest.
        self.setMinimumWidth(MIN_WIDTH)
        self.status = StatusBar(self)
        self.setStatusBar(self.status)

        self._wire()
        self._menus()
        self._shortcuts()
        self._restore_geometry()
        self.sidebar.select(s.last_panel if s.last_panel in self.panels else "chat")
        self.models.refresh()
        if s.start_server_on_launch and s.first_run_done:
            QTimer.singleShot(0, self._start_on_launch)  # once the window is up: a failure shows in it
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
        self.models.listed.connect(self._on_models_listed)
        self.chat_panel.model_switch_requested.connect(self.switch_model)
        self.chat_panel.picker_opened.connect(self.pool.refresh)
        self.pool.changed.connect(lambda: self.chat_panel.set_pool_states(self.pool.loaded_models(), self.pool.loading))
        self.pool.load_progress.connect(self._on_pool_progress)
        self.pool.loaded.connect(self._on_pool_loaded)
        self.pool.load_failed.connect(self._on_pool_failed)
        self.chat_panel.eject_requested.connect(self.eject_model)
        self.pool.unloaded.connect(self._on_pool_unloaded)
        self.pool.unload_failed.connect(self._on_pool_unload_failed)
        self.chat_panel.start_server_requested.connect(self._start_for_chat)
        self.models_panel.use_model.connect(self._serve_model)
        self.models_panel.endpoint_changed.connect(self._remember_endpoint)
        self.monitor.sample.connect(self.server_panel.show_resources)
        self.monitor.gpu_sample.connect(self.server_panel.show_gpu)
        self.monitor.gpu_sample.connect(self._on_gpu)
        self.monitor.gpu_unavailable.connect(self.server_panel.gpu_unavailable)
        self.monitor.gpu_unavailable.connect(lambda _why: self.models.table.set_vram(None, no_gpu=True))
        # The status bar's tok/s is the last reply's own figure (the one under the message), not the
        # server-wide rate, which mixes in idle time and other clients.
        self.session.reply_finished.connect(self._on_reply_finished)
        self.session.reply_finished.connect(lambda _stats: self.pool.refresh() if self.pool.pooled else None)
        self.chat_panel.notice.connect(self.toast)  # copied, exported: a brief word, not silence
        self.server_panel.notice.connect(self.toast)
        self.server_panel.settings_changed.connect(self.chat_panel.refresh_connection)
        self.server_panel.settings_changed.connect(self._server_settings_changed)
        self.share_panel.server_change.connect(self._on_share_server)
        self.share.result.connect(lambda r: self._on_share_off() if r.get("action") == "off" else None)
        # The Logs panel says why a share step failed, not only that the panel showed an error.
        self.share.failed.connect(lambda action, why: self.logs.add("share", f"share {action} failed: {why}"))
        self._on_server_state(self.server.state, "")

    def _menus(self) -> None:
        """File menu (New chat, Quit: Ctrl+Q) and a tray icon with Show/Quit: the app can always be quit,
        also where no window manager draws a close button."""
        file_menu = self.menuBar().addMenu("&File")
        new = QAction("New chat", self, shortcut=QKeySequence("Ctrl+N"))
        new.triggered.connect(lambda: (self.sidebar.select("chat"), self.chat_panel.new_chat()))
        self.settings_action = QAction("Settings…", self, shortcut=QKeySequence("Ctrl+,"))
        self.settings_action.setShortcutContext(Qt.ShortcutContext.ApplicationShortcut)
        self.settings_action.triggered.connect(self.open_settings)
        self.quit_action = QAction("Quit", self, shortcut=QKeySequence("Ctrl+Q"))
        self.quit_action.setShortcutContext(Qt.ShortcutContext.ApplicationShortcut)
        self.quit_action.triggered.connect(self.quit_app)
        tools = QAction("Tools (MCP servers)…", self)
        tools.triggered.connect(self.open_tools)
        file_menu.addAction(new)
        file_menu.addAction(self.settings_action)
        file_menu.addAction(tools)
        file_menu.addSeparator()
        file_menu.addAction(self.quit_action)
        self.tray: QSystemTrayIcon | None = None
        if QSystemTrayIcon.isSystemTrayAvailable():
            self.tray = QSystemTrayIcon(self.windowIcon(), self)
            menu = QMenu(self)
            menu.addAction("Show wslm", self.bring_to_front)
            menu.addAction(self.quit_action)
            self.tray.setContextMenu(menu)
            self.tray.setToolTip("wslm")
            self.tray.show()

    def open_tools(self) -> McpPage:
        """The Tools page (MCP servers) in a window of its own."""
        if self._mcp_page is None:
            self._mcp_page = McpPage(self.mcp, self)
            self._mcp_page.setWindowFlags(Qt.WindowType.Window)
            self._mcp_page.resize(900, 600)
        self._mcp_page.show()
        self._mcp_page.raise_()
        return self._mcp_page

    # Settings (File → Settings…, Ctrl+,)
    def open_settings(self, page: str = "") -> SettingsDialog:
        """Open the Settings dialog (non-modal, one at a time) and return it."""
        if self.settings_dialog is not None and self.settings_dialog.isVisible():
            self.settings_dialog.raise_()
            self.settings_dialog.activateWindow()
            if page:
                self.settings_dialog.show_page(page)
            return self.settings_dialog
        self.server_panel._save()  # the dialog starts from what the Server panel shows now
        dialog = SettingsDialog(self.settings, self.models.table.models, self, backend_path=self._server_path)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        for title, make in self.settings_pages:
            dialog.add_page(title, make())
        dialog.applied.connect(self._on_settings_applied)
        dialog.notice.connect(self.toast)
        dialog.destroyed.connect(lambda: setattr(self, "settings_dialog", None))
        self.settings_dialog = dialog
        if page:
            dialog.show_page(page)
        dialog.show()
        return dialog

    def _on_settings_applied(self, changed: list) -> None:
        """Make the panels follow what the Settings dialog changed, and save."""
        s = self.settings
        if {"model", "start_server_on_launch", "api_key"} & set(changed):
            self.server_panel.reload()  # (it saves, and the chat's picker follows its model)
        if "api_key" in changed and self.server.running:
            self.toast("The new API key takes effect when the server restarts (Server → Restart)", 8000)
        if "theme" in changed and current_theme() != s.theme:
            app = QApplication.instance()
            if isinstance(app, QApplication):
                apply_theme(app, s.theme)
            self.toast("Theme changed: some colours follow at the next start", 6000)
        if "models_dir" in changed:
            apply_models_dir(s.models_dir)
            self.models.refresh()
            if self.server.running:
                self.toast("The server uses the new models folder when it restarts", 6000)
        docs = [n for n in changed if n.startswith("rag_")]
        if docs:
            self._sync_document_settings()
        self.save()

    def _sync_document_settings(self) -> None:
        """The chat's own Documents fields (if it has them) show the values the dialog set."""
        view = getattr(self.chat_panel, "document_settings", None)
        s = self.settings
        for attr, value in (("url", s.rag_embed_base_url), ("model", s.rag_embed_model), ("key", s.rag_embed_api_key),
                            ("whole", s.rag_whole_file_tokens), ("top_k", s.rag_top_k)):
            w = getattr(view, attr, None)
            if w is None:
                continue
            w.blockSignals(True)
            if hasattr(w, "setValue"):
                w.setValue(int(value))
            else:
                w.setText(str(value))
            w.blockSignals(False)

    def bring_to_front(self) -> None:
        """Another `wslm gui` was started: show this window instead (restored, raised, focused)."""
        if self.isMinimized():
            self.showNormal()
        self.show()
        self.raise_()
        self.activateWindow()
        self.toast("wslm is already open: here it is", 4000)

    def quit_app(self) -> None:
        """Quit (menu, Ctrl+Q, tray): close the window, which asks first if the server runs."""
        if self.close() and self.quit_ends_app:
            QApplication.quit()  # also when a dialog is open or the tray keeps the app alive

    def confirm_close(self) -> bool:
        """Closing stops the server: ask when one runs (or loads). Tests replace this."""
        if not self.server.running or not self.quit_ends_app:
            return True  # (windows made for tests and screenshots never block on a dialog)
        answer = QMessageBox.question(
            self, "Quit wslm",
            f"The server is {self.server.state} ({self.server.config.model}). Quitting stops it, and every "
            "client using it loses its connection. Stop the server and quit?",
            QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel, QMessageBox.StandardButton.Cancel)
        return answer == QMessageBox.StandardButton.Yes

    def _shortcuts(self) -> None:
        """Ctrl+1..5: panels; Ctrl+N: new chat; Esc: stop the reply."""
        for i, (key, _icon, _label) in enumerate(PANELS, start=1):
            QShortcut(QKeySequence(f"Ctrl+{i}"), self, activated=lambda k=key: self.sidebar.select(k))
        QShortcut(QKeySequence(Qt.Key.Key_Escape), self,
                  activated=lambda: (self.session.stop(), self.chat_panel.cancel_edit()))

    def _watch_share(self) -> None:
        from wslm.wsl_bridge import winexec

        if winexec.is_windows():
            self.share.poll()
            self.share.start_watching()
        else:
            from wslm.gui.share_service import NOT_WINDOWS

            self.share_panel.set_unavailable(NOT_WINDOWS)

    def show_panel(self, key: str) -> None:
        if key in self.panels:
            self.stack.setCurrentWidget(self.pages[key])
            self.settings.last_panel = key

    def _on_server_state(self, state: str, detail: str) -> None:
        if state == STOPPING and self.settings.chat_use_server:
            # The replies our server is writing end with it: keep their text, say why they stopped.
            self.session.interrupt("the model was switched" if self._switching_to else "the server was stopped")
        coming = state in (STARTING, LOADING) or self.server.restart_pending
        self.chat_panel.set_server_state(state, coming, self.server.cause.title if self.server.cause else detail)
        if self._switching_to:
            self.chat_panel.show_switch(self._switching_to, state, detail)
            # Done when the new model is ready, or it failed, or the user stopped the server meanwhile.
            if state in (READY, CRASHED) or (state == STOPPED and not self.server.restart_pending):
                self._switching_to = ""
        words = self.server_panel.state_text(state).lower()  # "failed to start", not "crashed", before ready
        self.status.set_state(state, target_label(self.target), words)
        model = self.server.ready_event.get("model") or self.server.config.model
        self.setWindowTitle(f"wslm — {model}" if state == READY else f"wslm — server {words}")
        self.status.set_model((self.server.ready_event.get("model") or self.server.config.model) if state == READY else "")
        if state != READY:
            if self.pool.base_url:
                self.pool.set_server("")  # a load still running is reported failed (the server went)
            self.chat_panel.set_server("", "", "")
            self.status.set_kv(None)
            self.status.set_speed(None)
        elif not self.settings.chat_use_server:
            self.status.set_speed(None)  # a reply from the chat's own URL is not this server's speed

    def toast(self, text: str, ms: int = 4000) -> None:
        """A brief confirmation in the status bar (it goes by itself)."""
        self.status.showMessage(text, ms)

    def _on_reply_finished(self, stats: dict) -> None:
        """The last reply's tok/s. From the chat's own URL while our server runs, it says where it came from:
        beside "Model: demo" it would read as our server's speed."""
        elsewhere = ""
        if not self.settings.chat_use_server and self.server.state == READY:
            elsewhere = str(stats.get("model") or self.session.model or "custom URL")
        self.status.set_speed(stats.get("tokens_per_s"), elsewhere)

    def _start_for_chat(self) -> None:
        """The chat's "start it": the Server panel's own Start (it checks the fields first)."""
        if not self.server.running:
            self.server_panel.start()

    def _start_on_launch(self) -> None:
        """The "Start the server when wslm opens" setting: the Server panel's own Start (it checks the fields)."""
        if not self.server.running:
            self.server_panel.start()

    def _on_server_ready(self, event: dict) -> None:
        self.share_panel.remove_note(SERVER_NOT_RUNNING)
        self.chat_panel.set_server(self.server.base_url, str(event.get("model") or self.server.config.model),
                                   self.server.config.api_key, event.get("max_model_len"))
        self.pool.set_server(self.server.base_url, self.server.config.api_key)  # which models it serves, loaded or not

    def _on_metrics(self, m: dict) -> None:
        self.status.set_kv(m.get("kv_cache_usage"))

    def _on_gpu(self, g: dict) -> None:
        self.models.table.set_vram(int(g["vram_total_mib"] * 2**20), self.settings.gpu_memory_utilization)

    def _remember_endpoint(self, endpoint: str) -> None:
        self.settings.hub_endpoint = endpoint
        self.save()

    def _serve_model(self, model_id: str) -> None:
        """Models → Serve: serve that model now, as the chat's picker does (a pool load beside the running
        model, else a restart, or a start when the server is stopped), and show the Server panel."""
        self.server_panel.set_model(model_id)
        self.sidebar.select("server")
        self.switch_model(model_id)

    def _server_settings_changed(self) -> None:
        self.chat_panel.set_serve_choice(self.server_panel.model_id())  # the chat's picker follows the panel
        # The estimates are for the server these settings start: its context, its KV cache's dtype and size.
        kv_args = kv_estimate_args(self.settings.kv_cache_dtype, self.settings.serve_extra_args, _draft(self.settings))
        if self.models.context != self.settings.max_model_len or self.models.kv_args != kv_args:
            self.models.context = self.settings.max_model_len
            self.models.kv_args = kv_args
            self.models.refresh()

    def _on_models_listed(self, _ids: list) -> None:
        self.server_panel.set_models(self.models.table.models)
        # The chat's picker offers chat models: embedding models (the shipped one among them) embed documents.
        chat_models = [m for m in self.models.table.models
                       if not isinstance(m, dict) or m.get("task", "generate") == "generate"]
        self.chat_panel.set_installed_models(chat_models, self.server_panel.model_id())
        if self.pool.pooled:
            self.pool.refresh()  # `--model-pool all` serves a model pulled since start: the server rescans

    # Model switch (Chat's model picker). With a model pool that holds the model: load it beside the running
    # one (POST /v1/models/load) and talk to it, no restart. Else: stop, start with the new model, wait for
    # ready, with progress.
    def _live_switch(self, model_id: str) -> bool:
        return self.server.state == READY and self.settings.chat_use_server and self.pool.can_load(model_id)

    def switch_model(self, model_id: str) -> None:
        if self._live_switch(model_id):
            if self.pool.loading:
                self.chat_panel.show_load(model_id, "failed", f"{self.pool.loading} is still loading; pick "
                                          f"{model_id} again when it is ready")
                self.chat_panel.show_load(self.pool.loading, self.pool.state(self.pool.loading) or "loading")
            elif model_id != self.chat_panel.server_model:
                self.pool.load(model_id)
            return
        if self.server.state == READY and self.server.config.model == model_id:
            return
        self.server_panel.set_model(model_id)
        model = next((m for m in self.models.table.models if m.get("id") == model_id), {})
        own = int(model.get("context_length") or 0)
        if own and self.server_panel.context.value() > own:
            self.server_panel.context.setValue(0)  # longer than this model's context: use the model's own
        self._switching_to = model_id
        self.chat_panel.show_switch(model_id, "stopping" if self.server.running else "starting", "")
        if self.server.running:
            self.server_panel.restart()
        else:
            self.server_panel.start()

    def _on_pool_progress(self, model_id: str, state: str) -> None:
        self.chat_panel.show_load(model_id, state)
        self.status.set_model(f"{model_id} (loading…)")
        self.setWindowTitle(f"wslm — loading {model_id}")

    def _on_pool_loaded(self, model_id: str, card: dict) -> None:
        """The chosen model is loaded: the chat talks to it from now on (same server, same URL)."""
        if self.server.state != READY:
            return
        context = card.get("max_model_len")
        self.chat_panel.set_server(self.server.base_url, model_id, self.server.config.api_key,
                                   int(context) if context else None)
        self.chat_panel.show_load(model_id, "loaded")
        self.chat_panel.set_pool_states(self.pool.loaded_models(), self.pool.loading)
        self.status.set_model(model_id)
        self.setWindowTitle(f"wslm — {model_id}")
        self.logs.add("server", f"switched the chat to {model_id} (loaded beside the others, no restart)")

    def _on_pool_failed(self, model_id: str, message: str) -> None:
        """The load failed (out of memory, a broken file, ...): the chat keeps the model it had."""
        self.chat_panel.show_load(model_id, "failed", message)
        self.chat_panel.set_pool_states(self.pool.loaded_models(), self.pool.loading)
        self.logs.add("server", f"loading {model_id} failed: {message}")
        if self.server.state == READY:
            kept = self.chat_panel.server_model
            self.status.set_model(kept)
            self.setWindowTitle(f"wslm — {kept}")

    # Eject (the Chat panel's ⏏ menu): unload a model the pool loaded, to free its memory. The model the
    # server started with stays (the server refuses it); the chat on an ejected model goes back to that one.
    def _can_eject(self, model_id: str) -> bool:
        return self.server.state == READY and self.settings.chat_use_server and self.pool.can_unload(model_id)

    def eject_model(self, model_id: str) -> None:
        if not self.pool.unload(model_id):
            self.chat_panel.show_eject(model_id, "it is not loaded beside the server's own model now")
            return
        self.logs.add("server", f"ejecting {model_id} (POST /v1/models/unload)")

    def _on_pool_unloaded(self, model_id: str) -> None:
        self.logs.add("server", f"ejected {model_id}: its memory is free")
        if self.server.state == READY and self.chat_panel.server_model == model_id:
            kept = self.pool.default_model() or self.server.config.model
            context = self.pool.cards.get(kept, {}).get("max_model_len")
            self.chat_panel.set_server(self.server.base_url, kept, self.server.config.api_key,
                                       int(context) if context else None)
            self.status.set_model(kept)
            self.setWindowTitle(f"wslm — {kept}")
            self.logs.add("server", f"the chat talks to {kept} again (its model was ejected)")
        self.chat_panel.set_pool_states(self.pool.loaded_models(), self.pool.loading)
        self.chat_panel.show_eject(model_id)

    def _on_pool_unload_failed(self, model_id: str, message: str) -> None:
        """The server refused (a reply still running on it) or could not be asked: nothing changed."""
        self.logs.add("server", f"ejecting {model_id} failed: {message}")
        self.chat_panel.show_eject(model_id, message)

    def _server_path(self, path: str) -> str:
        """A file chosen on this machine as the backend's side sees it (WSL: C:\\x -> /mnt/c/x)."""
        return _linux_path(Path(path)) if self.target.via_wsl else path

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
            self.server_panel.api_key_field.set_text(key)
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
        self.server.pool_refused = False  # that target's wslm may know --model-pool
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
        if not self.confirm_close():
            event.ignore()
            return
        if self.tray is not None:
            self.tray.hide()
        self.save()
        self.monitor.stop()
        self.share.stop_watching()
        self.session.shutdown()
        self.mcp.close()  # ends the stdio MCP servers it started
        self.models_panel.shutdown()
        self.models.shutdown()
        self.server.shutdown()
        if self._own_store:
            self.store.close()
        super().closeEvent(event)


def _draft(settings) -> str:
    """The speculative draft model the Server panel's server would load beside its model, or ""."""
    return settings.speculative_draft if settings.speculative_decoding else ""
