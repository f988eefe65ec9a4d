"""Share panel: the "Share on LAN" switch against the bridge's fake Windows programs (netsh, wsl.exe,
powershell.exe); the WSL IP changing is noticed and the rules are re-pointed by themselves."""

from __future__ import annotations

import pytest

pytest.importorskip("PySide6")

from fake_windows import use  # noqa: E402
from PySide6.QtGui import QGuiApplication  # noqa: E402

from wslm.gui.chat_store import ChatStore  # noqa: E402
from wslm.gui.main_window import MainWindow  # noqa: E402
from wslm.gui.settings import Settings  # noqa: E402
from wslm.wsl_bridge import share  # noqa: E402


def our_proxies(fw) -> list[dict]:
    return [r for r in fw.state["portproxy"] if r["listen_port"] == 8000]


@pytest.mark.timeout(180)
def test_share_switch_on_refresh_off(qtbot, tmp_path, monkeypatch):
    fw = use(monkeypatch, tmp_path)
    monkeypatch.setenv("WSLM_ASSUME_ADMIN", "1")
    # The fake distro reads this machine's /proc/net/tcp: anything else on 8000 here is not its backend.
    monkeypatch.setattr(share, "listening_addresses", lambda target, port: [])
    window = MainWindow(Settings(first_run_done=True, port=8000), ChatStore(tmp_path / "c.sqlite3"), watch=False)
    qtbot.addWidget(window)
    window.show()
    window.sidebar.select("share")
    panel, service = window.share_panel, window.share

    with qtbot.waitSignal(service.status_changed, timeout=60_000):
        service.poll()
    assert not panel.switch.isChecked() and panel.state_label.text() == "Off"
    assert panel.fields["mode"].text() == "NAT" and panel.fields["wsl_ip"].text() == "172.20.1.2"

    with qtbot.waitSignal(service.result, timeout=60_000) as on:
        panel.switch.click()
    assert on.args[0]["action"] == "on", on.args
    qtbot.waitUntil(lambda: not service.busy)
    assert panel.switch.isChecked() and panel.state_label.text() == "On"
    assert our_proxies(fw) == [{"listen_address": "0.0.0.0", "listen_port": 8000,
                                "connect_address": "172.20.1.2", "connect_port": 8000}]
    assert any(r["name"] == "wslm-share-8000" for r in fw.state["firewall"])
    assert panel.url_rows and not panel.no_urls.isVisible()
    assert "portproxy" in panel.rules_label.text() and "firewall" in panel.rules_label.text()
    # The backend is told to listen on all interfaces with the share's key.
    key = panel.key_edit.text()
    assert key and window.settings.host == "0.0.0.0" and window.settings.api_key == key
    assert window.server_panel.api_key.text() == key
    assert "not running" in panel.notes.text()  # where to go next
    assert "generated an API key" in panel.notes.text() and "wslm share key" not in panel.notes.text()
    url_copy = panel.url_rows[0].findChildren(type(panel.refresh_button))[0]
    url_copy.click()
    assert QGuiApplication.clipboard().text().startswith("http://")

    # WSL restarted with a new IP: the next status check finds stale rules and refreshes them.
    fw.set_distro("Ubuntu", ip="172.20.9.9")
    with qtbot.waitSignal(service.result, timeout=60_000) as refreshed:
        service.poll()
    assert refreshed.args[0]["action"] == "refresh"
    qtbot.waitUntil(lambda: not service.busy)
    assert our_proxies(fw)[0]["connect_address"] == "172.20.9.9"
    assert panel.fields["wsl_ip"].text() == "172.20.9.9"

    with qtbot.waitSignal(service.result, timeout=60_000):
        panel.switch.click()
    qtbot.waitUntil(lambda: not service.busy)
    assert not panel.switch.isChecked() and our_proxies(fw) == []
    assert not any(r["name"] == "wslm-share-8000" for r in fw.state["firewall"])
    assert window.settings.host == "127.0.0.1"  # loopback again
    window.close()


def test_share_failure_is_explained(qtbot, tmp_path, monkeypatch):
    fw = use(monkeypatch, tmp_path)
    fw.update(distros=[])  # WSL without distros
    window = MainWindow(Settings(first_run_done=True), ChatStore(tmp_path / "c.sqlite3"), watch=False)
    qtbot.addWidget(window)
    with qtbot.waitSignal(window.share.failed, timeout=60_000) as failed:
        window.share_panel.switch.click()
    assert failed.args[0] == "on" and failed.args[1]
    assert not window.share_panel.switch.isChecked()
    assert "failed" in window.share_panel.notes.text()
    window.close()
