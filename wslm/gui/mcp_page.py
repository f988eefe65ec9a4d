"""The Tools page: the MCP servers of mcp.json, to add (a stdio command or a URL), edit, enable or disable,
remove, import from LM Studio or Claude Desktop, and inspect (status, tools with their descriptions and
input schemas, the last error). A plain QWidget: a page of the Settings dialog, or a window of its own."""

from __future__ import annotations

import json
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QSplitter,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm.gui import theme
from wslm.gui.mcp_client import CONNECTING, ERROR, OFF, READY
from wslm.gui.mcp_config import McpConfigError, ServerConfig, import_candidates
from wslm.gui.mcp_service import McpService

STATE_TEXT = {OFF: ("off", theme.MUTED), CONNECTING: ("connecting…", theme.WARN), READY: ("ready", theme.OK),
              ERROR: ("error", theme.ERROR)}
STDIO, HTTP = "stdio", "http"


def split_command(text: str) -> list[str]:
    """A command line as words: spaces split, "double" or 'single' quotes group; backslashes stay as typed
    (Windows paths: shlex would eat them)."""
    words, cur, quote, started = [], "", "", False
    for c in text:
        if quote:
            if c == quote:
                quote = ""
            else:
                cur += c
        elif c in "\"'":
            quote, started = c, True
        elif c.isspace():
            if cur or started:
                words.append(cur)
            cur, started = "", False
        else:
            cur += c
    if cur or started:
        words.append(cur)
    return words


def join_command(words: list[str]) -> str:
    return " ".join(f'"{w}"' if not w or any(c.isspace() or c == "'" for c in w) else w for w in words)


def _pairs(text: str, sep: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        key, found, value = line.partition(sep)
        if found and key.strip():
            out[key.strip()] = value.strip()
    return out


class ServerDialog(QDialog):
    """Add or edit one server: a command to start (stdio) or a URL (streamable HTTP)."""

    def __init__(self, server: ServerConfig | None = None, taken: set[str] = frozenset(), parent=None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Edit MCP server" if server else "Add MCP server")
        self.setMinimumWidth(520)
        self.taken = set(taken) - ({server.name} if server else set())
        self.original = server or ServerConfig("")
        form = QFormLayout()
        self.name = QLineEdit(self.original.name)
        self.name.setPlaceholderText("e.g. files")
        self.kind = QComboBox()
        self.kind.addItem("Command (stdio)", STDIO)
        self.kind.addItem("URL (streamable HTTP)", HTTP)
        self.kind.setCurrentIndex(1 if self.original.url else 0)
        self.command = QLineEdit(join_command([self.original.command, *self.original.args]) if self.original.command else "")
        self.command.setPlaceholderText("npx -y @modelcontextprotocol/server-filesystem /home/me")
        self.cwd = QLineEdit(self.original.cwd)
        self.cwd.setPlaceholderText("(optional) folder to start it in")
        self.env = QPlainTextEdit("\n".join(f"{k}={v}" for k, v in self.original.env.items()))
        self.env.setPlaceholderText("KEY=value, one a line")
        self.env.setMaximumHeight(70)
        self.url = QLineEdit(self.original.url)
        self.url.setPlaceholderText("http://127.0.0.1:8080/mcp")
        self.headers = QPlainTextEdit("\n".join(f"{k}: {v}" for k, v in self.original.headers.items()))
        self.headers.setPlaceholderText("Authorization: Bearer …, one a line")
        self.headers.setMaximumHeight(70)
        self.timeout = QDoubleSpinBox()
        self.timeout.setRange(1, 3600)
        self.timeout.setSuffix(" s")
        self.timeout.setValue(self.original.timeout_s)
        self.enabled = QCheckBox("Enabled (its tools are offered in chats)")
        self.enabled.setChecked(self.original.enabled)
        form.addRow("Name", self.name)
        form.addRow("Kind", self.kind)
        self._stdio_rows = [("Command", self.command), ("Working folder", self.cwd), ("Environment", self.env)]
        self._http_rows = [("URL", self.url), ("Headers", self.headers)]
        for label, widget in self._stdio_rows + self._http_rows:
            form.addRow(label, widget)
        form.addRow("Call timeout", self.timeout)
        form.addRow("", self.enabled)
        self.form = form
        self.error = QLabel("")
        self.error.setStyleSheet(f"color: {theme.ERROR};")
        self.error.setWordWrap(True)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self._accept)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.error)
        layout.addWidget(buttons)
        self.kind.currentIndexChanged.connect(self._show_kind)
        self._show_kind()

    def _show_kind(self) -> None:
        http = self.kind.currentData() == HTTP
        for rows, visible in ((self._stdio_rows, not http), (self._http_rows, http)):
            for _label, widget in rows:
                self.form.setRowVisible(widget, visible)

    def server(self) -> ServerConfig:
        """The server as entered (check() says what is missing)."""
        http = self.kind.currentData() == HTTP
        words = split_command(self.command.text())
        return ServerConfig(
            name=self.name.text().strip(), command="" if http else (words[0] if words else ""),
            args=[] if http else words[1:], env={} if http else _pairs(self.env.toPlainText(), "="),
            cwd="" if http else self.cwd.text().strip(), url=self.url.text().strip() if http else "",
            headers=_pairs(self.headers.toPlainText(), ":") if http else {}, enabled=self.enabled.isChecked(),
            always_allow=list(self.original.always_allow), timeout_s=float(self.timeout.value()),
            extra=dict(self.original.extra))

    def _accept(self) -> None:
        server = self.server()
        why = ("Give the server a name." if not server.name else
               f"There is already a server named {server.name!r}." if server.name in self.taken else server.check())
        if why:
            self.error.setText(why)
            return
        self.accept()


class McpPage(QWidget):
    def __init__(self, service: McpService, parent=None) -> None:
        super().__init__(parent)
        self.setObjectName("McpPage")
        self.setWindowTitle("Tools (MCP servers)")
        self.service = service
        title = QLabel("Tools: MCP servers")
        title.setObjectName("Title")
        intro = QLabel("Servers speaking the Model Context Protocol give the chat's model tools (files, search, "
                       "your own scripts). Each call asks you first. Stored in "
                       f"{service.config.path or 'mcp.json'}, in the mcpServers shape LM Studio and Claude "
                       "Desktop use.")
        intro.setWordWrap(True)
        intro.setProperty("muted", True)
        self.load_error = QLabel(service.load_error)
        self.load_error.setWordWrap(True)
        self.load_error.setStyleSheet(f"color: {theme.ERROR};")
        self.load_error.setVisible(bool(service.load_error))

        self.list = QListWidget()
        self.list.setObjectName("McpServers")
        self.list.currentItemChanged.connect(lambda *_: self._show_details())
        self.list.itemChanged.connect(self._on_item_changed)
        self.list.itemDoubleClicked.connect(lambda *_: self.edit_server())
        self.add_button = QPushButton("Add…")
        self.add_button.setObjectName("Primary")
        self.edit_button = QPushButton("Edit…")
        self.remove_button = QPushButton("Remove")
        self.remove_button.setObjectName("Danger")
        self.reconnect_button = QPushButton("Reconnect")
        self.import_button = QPushButton("Import…")
        self.import_button.setToolTip("Add the servers of LM Studio's mcp.json or Claude Desktop's config")
        self.add_button.clicked.connect(lambda: self.add_server())
        self.edit_button.clicked.connect(lambda: self.edit_server())
        self.remove_button.clicked.connect(lambda: self.remove_server())
        self.reconnect_button.clicked.connect(self._reconnect)
        self.import_button.clicked.connect(self._import_menu)
        buttons = QHBoxLayout()
        for b in (self.add_button, self.edit_button, self.remove_button, self.reconnect_button, self.import_button):
            buttons.addWidget(b)
        buttons.addStretch(1)

        self.detail_title = QLabel("")
        self.detail_title.setStyleSheet("font-weight: 600;")
        self.detail_status = QLabel("")
        self.detail_status.setWordWrap(True)
        self.detail_status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.tools = QTreeWidget()
        self.tools.setObjectName("McpTools")
        self.tools.setHeaderLabels(["Tool", "Description"])
        self.tools.setColumnWidth(0, 160)
        self.tools.setWordWrap(True)
        self.error_box = QPlainTextEdit()
        self.error_box.setReadOnly(True)
        self.error_box.setMaximumHeight(110)
        self.error_box.setPlaceholderText("No error")
        details = QWidget()
        dl = QVBoxLayout(details)
        dl.setContentsMargins(0, 0, 0, 0)
        dl.addWidget(self.detail_title)
        dl.addWidget(self.detail_status)
        dl.addWidget(self.tools, 1)
        self.error_label = QLabel("Last error")
        self.error_label.setProperty("muted", True)
        dl.addWidget(self.error_label)
        dl.addWidget(self.error_box)
        split = QSplitter()
        split.addWidget(self.list)
        split.addWidget(details)
        split.setSizes([220, 480])

        layout = QVBoxLayout(self)
        layout.addWidget(title)
        layout.addWidget(intro)
        layout.addWidget(self.load_error)
        layout.addLayout(buttons)
        layout.addWidget(split, 1)
        service.server_changed.connect(self._on_server_changed)
        service.config_changed.connect(self.refresh)
        self.refresh()

    # The list
    def refresh(self) -> None:
        current = self.current_name()
        self.list.blockSignals(True)
        self.list.clear()
        for server in self.service.servers():
            item = QListWidgetItem()
            item.setData(Qt.ItemDataRole.UserRole, server.name)
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
            item.setCheckState(Qt.CheckState.Checked if server.enabled else Qt.CheckState.Unchecked)
            self.list.addItem(item)
            self._paint_item(item)
        self.list.blockSignals(False)
        names = [s.name for s in self.service.servers()]
        if names:
            self.select(current if current in names else names[0])
        self._show_details()

    def _paint_item(self, item: QListWidgetItem) -> None:
        name = item.data(Qt.ItemDataRole.UserRole)
        server = self.service.server(name)
        status = self.service.status(name)
        state = status.state if server and server.enabled else OFF
        words, colour = STATE_TEXT.get(state, STATE_TEXT[OFF])
        tools = f" · {len(status.tools)} tools" if state == READY else ""
        self.list.blockSignals(True)
        item.setText(f"{name}  —  {words}{tools}" if server and server.enabled else f"{name}  —  disabled")
        item.setForeground(QColor(colour if state != READY else theme.TEXT))
        item.setToolTip(server.summary() if server else "")
        self.list.blockSignals(False)

    def current_name(self) -> str:
        item = self.list.currentItem()
        return str(item.data(Qt.ItemDataRole.UserRole)) if item else ""

    def select(self, name: str) -> None:
        for i in range(self.list.count()):
            if self.list.item(i).data(Qt.ItemDataRole.UserRole) == name:
                self.list.setCurrentRow(i)
                return

    def _on_item_changed(self, item: QListWidgetItem) -> None:
        self.service.set_enabled(item.data(Qt.ItemDataRole.UserRole), item.checkState() == Qt.CheckState.Checked)

    def _on_server_changed(self, name: str) -> None:
        for i in range(self.list.count()):
            if self.list.item(i).data(Qt.ItemDataRole.UserRole) == name:
                self._paint_item(self.list.item(i))
        if name == self.current_name():
            self._show_details()

    # The details
    def _show_details(self) -> None:
        name = self.current_name()
        server = self.service.server(name)
        for w in (self.edit_button, self.remove_button, self.reconnect_button):
            w.setEnabled(server is not None)
        self.tools.clear()
        if server is None:
            self.detail_title.setText("No MCP server yet: Add… one, or Import… LM Studio's or Claude Desktop's."
                                      if not self.service.servers() else "")
            self.detail_status.setText("")
            self.error_box.setPlainText("")
            return
        status = self.service.status(name)
        kind = "streamable HTTP" if server.url else "stdio"
        self.detail_title.setText(f"{name} ({kind}): {server.summary()}")
        if not server.enabled:
            text, colour = "disabled: its tools are not offered", theme.MUTED
        else:
            words, colour = STATE_TEXT.get(status.state, STATE_TEXT[OFF])
            text = words + (f" · {status.server_info}" if status.server_info else "")
            if status.state == READY:
                text += f" · {len(status.tools)} tools"
        allowed = f" · always allowed: {', '.join(server.always_allow)}" if server.always_allow else ""
        self.detail_status.setText(f'<span style="color:{colour};">● {text}</span>'
                                   f'<span style="color:{theme.MUTED};"> · timeout {server.timeout_s:g} s{allowed}</span>')
        for tool in status.tools:
            item = QTreeWidgetItem([tool.name, tool.description])
            item.setToolTip(1, tool.description)
            if tool.function and tool.function != tool.name:
                item.setToolTip(0, f"offered to the model as {tool.function}")
            schema = QTreeWidgetItem(["input schema", json.dumps(tool.input_schema, ensure_ascii=False)])
            schema.setToolTip(1, json.dumps(tool.input_schema, indent=2, ensure_ascii=False))
            item.addChild(schema)
            self.tools.addTopLevelItem(item)
        self.error_box.setPlainText(status.error)

    def tool_names(self) -> list[str]:
        """The tools listed for the selected server."""
        return [self.tools.topLevelItem(i).text(0) for i in range(self.tools.topLevelItemCount())]

    # Actions
    def add_server(self) -> None:
        dialog = ServerDialog(None, {s.name for s in self.service.servers()}, self)
        if dialog.exec() == QDialog.DialogCode.Accepted:
            new = dialog.server()
            self.service.put(new)
            self.select(new.name)

    def edit_server(self) -> None:
        name = self.current_name()
        server = self.service.server(name)
        if server is None:
            return
        dialog = ServerDialog(server, {s.name for s in self.service.servers()}, self)
        if dialog.exec() == QDialog.DialogCode.Accepted:
            new = dialog.server()
            self.service.put(new, old_name=name)
            self.select(new.name)

    def remove_server(self, ask: bool = True) -> None:
        name = self.current_name()
        if not name:
            return
        if ask and QMessageBox.question(self, "Remove MCP server", f"Remove {name!r} from mcp.json?") \
                != QMessageBox.StandardButton.Yes:
            return
        self.service.remove(name)

    def _reconnect(self) -> None:
        if self.current_name():
            self.service.reconnect(self.current_name())

    def _import_menu(self) -> None:
        menu = QMenu(self)
        for path in import_candidates():
            menu.addAction(str(path), lambda p=path: self.import_file(p))
        menu.addAction("Choose a file…", self._import_dialog)
        menu.exec(self.import_button.mapToGlobal(self.import_button.rect().bottomLeft()))

    def _import_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Import MCP servers", str(Path.home()), "JSON files (*.json)")
        if path:
            self.import_file(Path(path))

    def import_file(self, path: Path) -> list[str]:
        """Add the servers of an mcpServers file; a file that cannot be read is said, nothing changes."""
        try:
            added = self.service.import_file(path)
        except McpConfigError as exc:
            QMessageBox.warning(self, "Import MCP servers", str(exc))
            return []
        if added:
            self.select(added[0])
        return added

