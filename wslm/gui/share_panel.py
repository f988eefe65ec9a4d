"""Share panel: one "Share on LAN" switch; mode, LAN URLs, API key, proxy/firewall rules, warnings."""

from __future__ import annotations

import html

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm.gui import theme
from wslm.gui.share_service import ShareService
from wslm.gui.toggle_switch import ToggleSwitch


def card(title: str) -> tuple[QFrame, QVBoxLayout]:
    frame = QFrame(objectName="Card")
    lay = QVBoxLayout(frame)
    lay.setContentsMargins(14, 12, 14, 12)
    head = QLabel(title)
    head.setStyleSheet(f"color: {theme.MUTED}; font-weight: 600;")
    lay.addWidget(head)
    return frame, lay


class SharePanel(QWidget):
    server_change = Signal(dict)  # share on's `server` (host, port, api_key, serve_args) + restart_required

    def __init__(self, service: ShareService, parent=None) -> None:
        super().__init__(parent)
        self.service = service
        self._key_visible = False
        self.unavailable = ""  # why sharing cannot be used here (not Windows): the switch stays off and says so
        self._notes: list[tuple[str, str]] = []

        title = QLabel("Share on LAN", objectName="Title")
        subtitle = QLabel("Let other devices on your network use this model through the OpenAI API.",
                          objectName="Muted")
        self.switch = ToggleSwitch()
        self.switch.clicked.connect(self._toggled)
        self.state_label = QLabel("Off")
        self.state_label.setStyleSheet("font-weight: 600;")
        head = QHBoxLayout()
        text = QVBoxLayout()
        text.addWidget(title)
        subtitle.setWordWrap(True)
        subtitle.setMinimumWidth(1)
        text.addWidget(subtitle)
        head.addLayout(text, 1)
        head.addWidget(self.state_label)
        head.addWidget(self.switch)

        net, net_lay = card("Network")
        grid = QGridLayout()
        self.fields = {}
        for i, (key, label) in enumerate((("mode", "WSL networking"), ("distro", "Distro"),
                                          ("wsl_ip", "WSL IP"), ("port", "Port"))):
            grid.addWidget(QLabel(label, objectName="Muted"), i // 2, (i % 2) * 2)
            value = QLabel("—")
            value.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            grid.addWidget(value, i // 2, (i % 2) * 2 + 1)
            self.fields[key] = value
        grid.setColumnStretch(1, 1)
        grid.setColumnStretch(3, 1)
        net_lay.addLayout(grid)

        urls, self.urls_lay = card("LAN URLs")
        self.no_urls = QLabel("Turn sharing on to get a URL other devices can use.", objectName="Muted")
        self.no_urls.setWordWrap(True)
        self.urls_lay.addWidget(self.no_urls)
        self.url_rows: list[QWidget] = []

        key, key_lay = card("API key (clients send it as Bearer token)")
        row = QHBoxLayout()
        self.key_edit = QLineEdit()
        self.key_edit.setReadOnly(True)
        self.key_edit.setEchoMode(QLineEdit.EchoMode.Password)
        show = QPushButton("Show")
        show.clicked.connect(self._toggle_key)
        self.show_button = show
        copy = QPushButton("Copy")
        copy.clicked.connect(lambda: QGuiApplication.clipboard().setText(self._key()))
        regen = QPushButton("Regenerate")
        regen.clicked.connect(self._regenerate)
        for w in (self.key_edit, show, copy, regen):
            row.addWidget(w, 1 if w is self.key_edit else 0)
        self.key_buttons = (show, copy, regen)
        self.key_edit.textChanged.connect(self._update_key_buttons)
        key_lay.addLayout(row)

        rules, self.rules_lay = card("Windows rules")
        self.rules_label = QLabel("—")
        self.rules_label.setWordWrap(True)
        self.rules_label.setTextFormat(Qt.TextFormat.RichText)
        self.rules_lay.addWidget(self.rules_label)
        refresh_row = QHBoxLayout()
        self.refresh_button = QPushButton("↻  Refresh")
        self.refresh_button.setToolTip("Re-point the rules at the current WSL IP (also done by itself when it changes)")
        self.refresh_button.clicked.connect(service.refresh)
        checked = QLabel("Checked every 15 s; rules are re-pointed by themselves when the WSL IP changes.",
                         objectName="Muted")
        checked.setWordWrap(True)  # wraps rather than setting the window's minimum width
        checked.setMinimumWidth(1)
        refresh_row.addWidget(checked, 1)
        refresh_row.addWidget(self.refresh_button)
        self.rules_lay.addLayout(refresh_row)

        self.notes = QLabel()
        self.notes.setWordWrap(True)
        self.notes.setTextFormat(Qt.TextFormat.RichText)

        lay = QVBoxLayout(self)
        lay.setContentsMargins(18, 14, 18, 14)
        lay.setSpacing(12)
        lay.addLayout(head)
        lay.addWidget(self.notes)
        lay.addWidget(net)
        lay.addWidget(urls)
        lay.addWidget(key)
        lay.addWidget(rules)
        lay.addStretch(1)

        service.status_changed.connect(self.show_status)
        service.result.connect(self._on_result)
        service.failed.connect(self._on_failed)
        service.busy_changed.connect(self._on_busy)
        self._load_key()

    # Key
    def _key(self) -> str:
        return self.key_edit.text()

    def _load_key(self) -> None:
        self.key_edit.setPlaceholderText("made when sharing is first turned on")
        try:
            self.key_edit.setText(self.service.api_key())
        except OSError as exc:
            self.key_edit.setPlaceholderText(f"cannot read the key: {exc}")
        self._update_key_buttons()

    def _update_key_buttons(self, *_args) -> None:
        """Show / Copy / Regenerate only mean something once a key exists."""
        for b in self.key_buttons:
            b.setEnabled(bool(self._key()))

    def set_unavailable(self, text: str) -> None:
        """Not on Windows: the switch and Refresh cannot do anything here; they look it and say why."""
        self.unavailable = text
        tip = "LAN sharing is for Windows hosts: it sets up Windows' port forwarding and firewall for WSL."
        for w in (self.switch, self.refresh_button):
            w.setEnabled(False)
            w.setToolTip(tip)
        self.state_label.setText("Off")
        self._set_notes([(text, theme.MUTED)])

    def _toggle_key(self) -> None:
        self._key_visible = not self._key_visible
        self.key_edit.setEchoMode(QLineEdit.EchoMode.Normal if self._key_visible else QLineEdit.EchoMode.Password)
        self.show_button.setText("Hide" if self._key_visible else "Show")

    def _regenerate(self) -> None:
        self.key_edit.setText(self.service.regenerate_key())
        if self.service.status.get("enabled"):
            self.service.turn_on()  # the backend must restart with the new key
        self._set_notes([("The API key changed: clients need the new one.", theme.WARN)])

    def _on_result_key(self) -> None:
        if not self._key():
            self._load_key()

    # Switch
    def _toggled(self, checked: bool) -> None:
        (self.service.turn_on if checked else self.service.turn_off)()

    def _on_busy(self, busy: bool) -> None:
        self.switch.setEnabled(not busy and not self.unavailable)
        self.refresh_button.setEnabled(not busy and not self.unavailable)
        if busy:
            self.state_label.setText("Working…")

    def _on_result(self, data: dict) -> None:
        self._on_result_key()
        # The CLI's pointer to its own command becomes the panel's Show button.
        notes = [(m.replace("(`wslm share key --show`)", "(Show, under API key)"), theme.MUTED)
                 for m in data.get("messages", [])]
        notes += [(w, theme.WARN) for w in data.get("warnings", [])]
        self._set_notes(notes)
        if data.get("action") == "on" and data.get("server"):
            self.server_change.emit({**data["server"], "restart_required": data.get("restart_required", False),
                                     "backend": data.get("backend", {})})

    def _on_failed(self, action: str, message: str) -> None:
        self.switch.setChecked(bool(self.service.status.get("enabled")))
        self.state_label.setText("On" if self.switch.isChecked() else "Off")
        self._set_notes([(f"Share {action} failed: {message}", theme.ERROR)])

    def remove_note(self, text: str) -> None:
        self._set_notes([n for n in self._notes if n[0] != text])

    def add_note(self, text: str) -> None:
        self._notes.append((text, theme.WARN))
        self._set_notes(self._notes)

    def _set_notes(self, notes: list[tuple[str, str]]) -> None:
        self._notes = list(notes)
        self.notes.setText("<br>".join(f"<span style='color:{c};'>{'⚠ ' if c != theme.MUTED else ''}"
                                       f"{html.escape(t)}</span>" for t, c in notes))
        self.notes.setVisible(bool(notes))

    # Status
    def show_status(self, st: dict) -> None:
        on = bool(st.get("enabled"))
        self.switch.setChecked(on)
        self.state_label.setText("On" if on else "Off")
        self.state_label.setStyleSheet(f"font-weight: 600; color: {theme.OK if on else theme.MUTED};")
        mode = st.get("mode") or "—"
        self.fields["mode"].setText({"nat": "NAT", "mirrored": "Mirrored"}.get(mode, mode))
        self.fields["distro"].setText(st.get("distro") or "—")
        self.fields["wsl_ip"].setText(st.get("wsl_ip") or "—")
        self.fields["port"].setText(str(st.get("port") or "—"))
        for w in self.url_rows:
            w.deleteLater()
        self.url_rows = []
        for url in st.get("lan_urls") or []:
            row = QWidget(objectName="Row")
            h = QHBoxLayout(row)
            h.setContentsMargins(0, 0, 0, 0)
            label = QLabel(f"<span style='font-family:monospace; font-size:11pt;'>{html.escape(url)}</span>")
            label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            copy = QPushButton("Copy")
            copy.clicked.connect(lambda _=False, u=url: QGuiApplication.clipboard().setText(u))
            h.addWidget(label, 1)
            h.addWidget(copy)
            self.urls_lay.addWidget(row)
            self.url_rows.append(row)
        self.no_urls.setVisible(not self.url_rows)
        lines = []
        for r in st.get("rules") or []:
            target = f" → {r['connect_address']}:{r['connect_port']}" if r.get("connect_address") else ""
            color = theme.WARN if r.get("stale") else theme.OK
            flag = " (stale: the WSL IP changed)" if r.get("stale") else ""
            lines.append(f"<span style='color:{color};'>●</span> <b>{html.escape(r['kind'])}</b> "
                         f"{html.escape(r['name'])}{html.escape(target)}{flag}")
        self.rules_label.setText("<br>".join(lines) or "<span style='color:#8d96a8;'>No wslm rules in Windows.</span>")
        warnings = [(w, theme.WARN) for w in st.get("warnings") or []]
        if warnings or not self.notes.text():
            self._set_notes(warnings)
