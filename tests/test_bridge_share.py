"""`wslm share` end to end against faithful fake netsh.exe / powershell.exe / wsl.exe that keep their
state in a file. Without WSLM_ASSUME_ADMIN the plan goes through the real elevation path: PowerShell
Start-Process -Verb RunAs (the fake grants or refuses "UAC") running wslm's elevated helper, whose
results are read back from a file."""

from __future__ import annotations

import http.server
import json
import os
import socket
import stat
import subprocess
import sys
import threading

import pytest
from fake_windows import use

from wslm.cli import main
from wslm.wsl_bridge import apikey, share
from wslm.wsl_bridge.errors import ApplyError, ElevationCancelledError, ShareConflictError, ValidationError

FOREIGN_PROXY = {"listen_address": "0.0.0.0", "listen_port": 2222, "connect_address": "172.20.1.2", "connect_port": 22}
FOREIGN_FW = {"name": "Remote Desktop - User Mode (TCP-In)", "dir": "in", "action": "allow", "protocol": "tcp",
              "localport": "3389", "profile": "private,public", "remoteip": "any", "enable": "yes"}
FOREIGN_HV = {"name": "MyWebServer", "port": 80}


@pytest.fixture
def fw(monkeypatch, tmp_path):
    return use(monkeypatch, tmp_path, portproxy=[dict(FOREIGN_PROXY)], firewall=[dict(FOREIGN_FW)],
               hyperv=[dict(FOREIGN_HV)])


def run_json(capsys, *argv: str) -> tuple[int, dict]:
    rc = main(["share", *argv, "--json"])
    out = capsys.readouterr().out
    return rc, json.loads(out)


def uac_prompts(fw) -> int:
    return sum(1 for c in fw.calls if c[0] == "powershell.exe" and "Start-Process" in c[-1])


def ours(fw) -> tuple[list, list, list]:
    st = fw.state
    return ([r for r in st["portproxy"] if r != FOREIGN_PROXY], [r for r in st["firewall"] if r != FOREIGN_FW],
            [r for r in st["hyperv"] if r != FOREIGN_HV])


def test_on_status_off_round_trip_with_one_uac_prompt_each(fw, capsys, monkeypatch) -> None:
    # The fake distro reads this machine's /proc/net/tcp: whatever else listens on 8000 here (a dev server,
    # another test run) would count as its backend. This round trip is about a distro with none running.
    monkeypatch.setattr(share, "listening_addresses", lambda target, port: [])
    rc, on = run_json(capsys, "on")
    assert rc == 0 and on["applied"] and uac_prompts(fw) == 1
    proxies, rules, hv = ours(fw)
    assert proxies == [{"listen_address": "0.0.0.0", "listen_port": 8000, "connect_address": "172.20.1.2",
                        "connect_port": 8000}]
    # Made by New-NetFirewallRule: its Name (language-independent id) is wslm's, not a GUID.
    assert rules == [{"name": "wslm-share-8000", "dir": "in", "action": "allow", "protocol": "tcp", "localport": "8000",
                      "profile": "private", "remoteip": "localsubnet", "enable": "yes", "id": "wslm-share-8000"}]
    assert hv == []
    # The key exists, user-only, and is never printed unless asked.
    key = apikey.read_api_key()
    assert key and stat.S_IMODE(os.stat(apikey.api_key_path()).st_mode) == 0o600
    assert key not in json.dumps(on) and on["server"]["api_key"] == "<hidden>"
    assert on["server"]["serve_args"] == ["--host", "0.0.0.0", "--port", "8000", "--api-key", "<hidden>"]
    assert on["backend"]["running"] is False and not on["restart_required"]

    rc, st = run_json(capsys, "status")
    assert rc == 0
    assert {k: st[k] for k in ("mode", "distro", "port", "wsl_ip", "enabled", "api_key_set")} == {
        "mode": "nat", "distro": "Ubuntu", "port": 8000, "wsl_ip": "172.20.1.2", "enabled": True, "api_key_set": True}
    assert st["lan_urls"] == ["http://192.168.1.23:8000/v1"]  # not vEthernet, loopback or APIPA
    assert st["warnings"] == []
    kinds = {(r["kind"], r["listen_port"], r["connect_address"], r["stale"]) for r in st["rules"]}
    assert kinds == {("portproxy", 8000, "172.20.1.2", False), ("firewall", 8000, "", False)}
    assert all(r["name"] != FOREIGN_FW["name"] for r in st["rules"])  # only wslm's rules are listed

    assert main(["share", "key", "--show"]) == 0 and capsys.readouterr().out.strip() == key

    rc, off = run_json(capsys, "off")
    assert rc == 0 and off["applied"] and uac_prompts(fw) == 2
    assert ours(fw) == ([], [], [])
    st = fw.state  # unrelated rules were left exactly as they were
    assert st["portproxy"] == [FOREIGN_PROXY] and st["firewall"] == [FOREIGN_FW] and st["hyperv"] == [FOREIGN_HV]
    assert apikey.read_api_key() == key
    rc, st = run_json(capsys, "status")
    assert not st["enabled"] and st["rules"] == []


def test_idempotent_on_and_off(fw, capsys, monkeypatch) -> None:
    monkeypatch.setenv("WSLM_ASSUME_ADMIN", "1")  # applied in-process, no helper
    assert run_json(capsys, "on", "--port", "8123")[0] == 0
    fw.clear_calls()
    rc, again = run_json(capsys, "on", "--port", "8123")
    assert rc == 0 and not again["applied"] and again["plan"]["steps"] == []
    assert fw.changing_calls() == [] and uac_prompts(fw) == 0
    assert len(ours(fw)[0]) == 1 and len(ours(fw)[1]) == 1  # no duplicate firewall rule
    assert run_json(capsys, "off", "--port", "8123")[0] == 0
    fw.clear_calls()
    rc, again = run_json(capsys, "off", "--port", "8123")
    assert rc == 0 and not again["applied"] and fw.changing_calls() == []


def test_stale_ip_refresh_and_stopped_distro(fw, capsys) -> None:
    assert run_json(capsys, "on")[0] == 0
    fw.set_distro("Ubuntu", ip="172.20.7.7")  # WSL restarted with a new address
    rc, st = run_json(capsys, "status")
    [proxy] = [r for r in st["rules"] if r["kind"] == "portproxy"]
    assert proxy["stale"] and proxy["connect_address"] == "172.20.1.2" and st["wsl_ip"] == "172.20.7.7"
    fw.clear_calls()
    rc, dry = run_json(capsys, "refresh", "--dry-run")
    assert rc == 0 and len(dry["plan"]["steps"]) == 1 and fw.changing_calls() == [] and uac_prompts(fw) == 0
    rc, ref = run_json(capsys, "refresh")
    assert rc == 0 and ref["applied"] and uac_prompts(fw) == 1
    assert ours(fw)[0][0]["connect_address"] == "172.20.7.7" and fw.state["portproxy"][0] == FOREIGN_PROXY
    fw.clear_calls()
    rc, ref = run_json(capsys, "refresh")  # the GUI's timer: nothing stale, nothing elevated
    assert rc == 0 and not ref["applied"] and fw.changing_calls() == [] and uac_prompts(fw) == 0
    fw.set_distro("Ubuntu", state="Stopped", ip="172.20.8.8")
    fw.clear_calls()
    rc, ref = run_json(capsys, "refresh")
    assert rc == 0 and not ref["applied"] and "not running" in " ".join(ref["messages"])
    assert not any(c[0] == "wsl.exe" and "--" in c for c in fw.calls)  # did not start the distro
    assert fw.state["distros"][0]["state"] == "Stopped"


def test_mirrored_mode_uses_hyperv_rule_and_no_portproxy(fw, capsys) -> None:
    assert run_json(capsys, "on")[0] == 0  # first shared under NAT
    fw.set_distro("Ubuntu", mode="mirrored")
    rc, st = run_json(capsys, "status")
    assert st["mode"] == "mirrored" and [r["stale"] for r in st["rules"] if r["kind"] == "portproxy"] == [True]
    rc, on = run_json(capsys, "on")
    assert rc == 0 and uac_prompts(fw) == 2
    proxies, rules, hv = ours(fw)
    assert proxies == [] and [r["name"] for r in rules] == ["wslm-share-8000"]
    assert hv == [{"name": "wslm-share-8000", "port": 8000}]
    assert on["status"]["enabled"] and {r["kind"] for r in on["status"]["rules"]} == {"firewall", "hyperv"}
    assert run_json(capsys, "off")[0] == 0
    assert ours(fw) == ([], [], []) and fw.state["hyperv"] == [FOREIGN_HV]


def test_public_network_profile_warning(fw, capsys) -> None:
    fw.update(profiles=[{"InterfaceAlias": "Wi-Fi", "NetworkCategory": "Public"}])
    rc, st = run_json(capsys, "status", "--port", "8080")
    assert rc == 0 and st["lan_urls"] == ["http://192.168.1.23:8080/v1"]
    assert any("Public" in w and "Private" in w for w in st["warnings"])


def test_foreign_portproxy_on_the_same_port_is_a_conflict(fw, capsys) -> None:
    fw.update(portproxy=[dict(FOREIGN_PROXY, listen_port=8000, connect_port=8000, connect_address="172.20.0.9")])
    fw.clear_calls()
    with pytest.raises(ShareConflictError) as err:
        share.share_on(8000)
    assert "wslm did not create" in err.value.message and "portproxy delete" in err.value.fix
    assert fw.changing_calls() == [] and uac_prompts(fw) == 0
    assert main(["share", "on"]) == 1 and "fix:" in capsys.readouterr().err
    # The user's hand-made rule can be taken over explicitly; share off then removes it as wslm's.
    rc, on = run_json(capsys, "on", "--take-over")
    assert rc == 0 and [r["connect_address"] for r in fw.state["portproxy"]] == ["172.20.1.2"]
    assert run_json(capsys, "off")[0] == 0 and fw.state["portproxy"] == []


def test_cancelled_uac_prompt_changes_nothing(fw, capsys) -> None:
    fw.update(uac="cancel")
    before = fw.state
    rc = main(["share", "on"])
    err = capsys.readouterr().err
    assert rc == 3 and "declined" in err and "nothing was changed" in err
    after = fw.state
    assert after["portproxy"] == before["portproxy"] and after["firewall"] == before["firewall"]
    assert fw.changing_calls() == []
    with pytest.raises(ElevationCancelledError):
        share.share_on(8000)
    rc, st = run_json(capsys, "status")
    assert not st["enabled"] and st["rules"] == []


@pytest.mark.parametrize("assume_admin", [False, True])
def test_failed_step_rolls_back(fw, capsys, monkeypatch, assume_admin: bool) -> None:
    if assume_admin:
        monkeypatch.setenv("WSLM_ASSUME_ADMIN", "1")
    fw.update(fail=["New-NetFirewallRule -Name 'wslm"])
    with pytest.raises(ApplyError) as err:
        share.share_on(8000)
    assert "rolled back, nothing changed" in err.value.message and "The parameter is incorrect" in err.value.message
    result = err.value.result
    assert result["failed_step"] == 1 and result["rollback_ok"] and len(result["rollback"]) == 1
    # The portproxy rule was added, then removed again: no half-applied share.
    assert any("portproxy add" in " ".join(c) for c in fw.changing_calls())
    assert ours(fw) == ([], [], []) and fw.state["portproxy"] == [FOREIGN_PROXY]
    rc, st = run_json(capsys, "status")
    assert st["rules"] == []


def test_elevation_required_message_is_explained(fw, monkeypatch) -> None:
    monkeypatch.setenv("WSLM_ASSUME_ADMIN", "1")
    fw.update(admin=False)  # the process believes it is elevated, Windows disagrees
    with pytest.raises(ApplyError) as err:
        share.share_on(8000)
    assert "requires elevation" in err.value.message and "administrator" in err.value.fix
    assert ours(fw) == ([], [], [])


@pytest.mark.parametrize("argv", [["on", "--port", "0"], ["on", "--port", "65536"], ["status", "--port", "http"],
                                  ["on", "--distro", "Ubuntu;calc"], ["refresh", "--distro", "a b"],
                                  ["off", "--port", "-5"]])
def test_bad_ports_and_names_rejected_before_any_command(fw, capsys, argv) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["share", *argv])
    assert exc.value.code == 2 and "invalid" in capsys.readouterr().err
    assert fw.calls == []


def test_api_rejects_bad_input_before_any_command(fw) -> None:
    for call in (lambda: share.share_on(0), lambda: share.share_on(8000, "Ub untu"), lambda: share.share_off(70000),
                 lambda: share.share_refresh(distro="$(reboot)"), lambda: share.share_status(True)):
        with pytest.raises(ValidationError):
            call()
    assert fw.calls == []


def test_excluded_port_rejected_and_dry_run_changes_nothing(fw, capsys) -> None:
    with pytest.raises(ValidationError, match="reserved by Windows"):
        share.share_on(50001)
    rc, dry = run_json(capsys, "on", "--dry-run", "--port", "9000")
    assert rc == 0 and dry["dry_run"] and not dry["applied"]
    steps = dry["plan"]["steps"]
    assert [s["argv"][1:5] for s in steps[:1]] == [["interface", "portproxy", "add", "v4tov4"]]
    assert len(steps) == 2 and steps[1]["argv"][-1].startswith("$ErrorActionPreference='Stop'; New-NetFirewallRule")
    assert fw.changing_calls() == [] and apikey.read_api_key() is None


def test_off_works_when_wsl_is_gone(fw, capsys, monkeypatch) -> None:
    monkeypatch.setenv("WSLM_ASSUME_ADMIN", "1")
    assert run_json(capsys, "on")[0] == 0
    fw.update(distros=[])
    rc, off = run_json(capsys, "off")
    assert rc == 0 and off["applied"] and ours(fw) == ([], [], [])


class _KeyHandler(http.server.BaseHTTPRequestHandler):
    key = "secret"

    def do_GET(self) -> None:  # noqa: N802 - http.server's API
        ok = self.headers.get("Authorization") == f"Bearer {self.key}"
        self.send_response(200 if ok else 401)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def test_backend_report_says_when_a_restart_is_needed(fw, monkeypatch) -> None:
    monkeypatch.setenv("WSLM_ASSUME_ADMIN", "1")
    fw.set_distro("Ubuntu", ip="127.0.0.1")  # so that wslm's probe of <WSL IP>:port reaches our server
    fw.update(excluded=[])  # the OS picks the ports below: one may fall in the fake's excluded range
    with socket.socket() as s:  # a backend started without --host 0.0.0.0
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        res = share.share_on(port)
        assert res.backend["listen_addresses"] == ["127.0.0.1"] and res.restart_required
        assert "0.0.0.0" in res.backend["reason"]
    server = http.server.ThreadingHTTPServer(("0.0.0.0", 0), _KeyHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        apikey.api_key_path().write_text("secret\n")
        res = share.share_on(port)
        assert res.backend["api_key"] == "required" and not res.restart_required
        assert res.server["serve_args"][-1] == "secret"  # the caller (GUI) gets the real key
        new = apikey.regenerate_api_key()
        assert new != "secret" and apikey.read_api_key() == new
        res = share.share_on(port)
        assert res.backend["api_key"] == "mismatch" and res.restart_required
    finally:
        server.shutdown()


def test_cli_in_a_real_process_loads_no_torch(fw, tmp_path) -> None:
    code = ("import sys, json; from wslm.wsl_bridge.cli import share_handler; import argparse;"
            "ns = argparse.Namespace(action='status', port=8000, distro=None, dry_run=False, json=True,"
            " show_key=False, regenerate=False, take_over=False);"
            "rc = share_handler(ns); print(json.dumps({'rc': rc, 'torch': 'torch' in sys.modules}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ.copy(),
                         timeout=60)
    status, tail = out.stdout.rsplit("\n", 2)[0], json.loads(out.stdout.strip().splitlines()[-1])
    assert tail == {"rc": 0, "torch": False}, out.stderr
    data = json.loads(status)
    assert {"mode", "distro", "port", "wsl_ip", "enabled", "rules", "lan_urls", "api_key_set", "warnings"} <= set(data)
