"""`wslm share` on a Chinese or German Windows: netsh's text is translated there ("Regelname:",
"规则名称:", in the OEM code page), so wslm reads firewall rules as PowerShell JSON and matches them by
their Name, never by netsh's labels. Also: rules an older wslm made with netsh (GUID Name, wslm's
name only as DisplayName) are still removed."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from fake_windows import use

from wslm.cli import main
from wslm.wsl_bridge import firewall, share, state
from wslm.wsl_bridge.errors import ApplyError

FOREIGN_FW = {"name": "Remote Desktop - User Mode (TCP-In)", "dir": "in", "action": "allow", "protocol": "tcp",
              "localport": "3389", "profile": "private,public", "remoteip": "any", "enable": "yes"}
LOCALES = ["zh-CN", "de-DE"]


@pytest.fixture
def fw(monkeypatch, tmp_path, request):
    return use(monkeypatch, tmp_path, firewall=[dict(FOREIGN_FW)], locale=request.param)


def run_json(capsys, *argv: str) -> tuple[int, dict]:
    rc = main(["share", *argv, "--json"])
    return rc, json.loads(capsys.readouterr().out)


def wslm_left(fw) -> list[dict]:
    """Every wslm rule left in Windows, whatever created it."""
    st = fw.state
    return ([r for r in st["firewall"] if r["name"].lower().startswith("wslm") or r.get("id", "").startswith("wslm")]
            + st["portproxy"] + st["hyperv"])


def netsh(fw, *args: str, elevated: bool = False) -> tuple[int, bytes]:
    env = dict(os.environ, FAKE_WIN_ELEVATED="1") if elevated else dict(os.environ)
    proc = subprocess.run([str(fw.dir / "netsh.exe"), *args], capture_output=True, env=env, timeout=60)
    return proc.returncode, proc.stdout


@pytest.mark.parametrize("fw", LOCALES, indirect=True)
def test_fake_netsh_speaks_the_locale(fw) -> None:
    rc, raw = netsh(fw, "advfirewall", "firewall", "show", "rule", "name=all", "dir=in")
    text = raw.decode("gbk" if fw.state["locale"] == "zh-CN" else "cp850")
    assert rc == 0 and "Rule Name:" not in text
    assert ("规则名称:" if fw.state["locale"] == "zh-CN" else "Regelname:") in text
    # What older wslm parsed (English labels) finds nothing here: the bug this guards against.
    assert "wslm" not in text


@pytest.mark.parametrize("fw", LOCALES, indirect=True)
def test_share_on_status_off_leaves_no_wslm_rule(fw, capsys) -> None:
    rc, on = run_json(capsys, "on")  # through the UAC path (elevated helper)
    assert rc == 0 and on["applied"]
    assert on["status"]["enabled"] and {r["kind"] for r in on["status"]["rules"]} == {"portproxy", "firewall"}
    [rule] = [r for r in fw.state["firewall"] if r != FOREIGN_FW]
    assert rule["id"] == rule["name"] == "wslm-share-8000"  # found by its Name, not netsh's text
    rc, again = run_json(capsys, "on")
    assert rc == 0 and not again["applied"] and again["plan"]["steps"] == []  # recognised: nothing to redo
    rc, off = run_json(capsys, "off")
    assert rc == 0 and off["applied"]
    assert wslm_left(fw) == [] and fw.state["firewall"] == [FOREIGN_FW]
    rc, st = run_json(capsys, "status")
    assert rc == 0 and not st["enabled"] and st["rules"] == []


@pytest.mark.parametrize("fw", LOCALES, indirect=True)
def test_mirrored_share_off_removes_both_firewalls(fw, capsys, monkeypatch) -> None:
    monkeypatch.setenv("WSLM_ASSUME_ADMIN", "1")
    fw.set_distro("Ubuntu", mode="mirrored")
    rc, on = run_json(capsys, "on", "--port", "8123")
    assert rc == 0 and {r["kind"] for r in on["status"]["rules"]} == {"firewall", "hyperv"}
    assert run_json(capsys, "off", "--port", "8123")[0] == 0
    assert wslm_left(fw) == [] and fw.state["firewall"] == [FOREIGN_FW]


def _legacy_rule(fw) -> dict:
    """The rule an older wslm made: `netsh advfirewall firewall add rule name=wslm-share-8000 ...`."""
    rc, _ = netsh(fw, "advfirewall", "firewall", "add", "rule", "name=wslm-share-8000", "dir=in", "action=allow",
                  "protocol=TCP", "localport=8000", "profile=private", "remoteip=localsubnet", "enable=yes",
                  elevated=True)
    assert rc == 0
    with state.locked() as st:
        st.put(state.OwnedRule("firewall", 8000, name="wslm-share-8000", distro="Ubuntu"))
    [legacy] = [r for r in fw.state["firewall"] if r["name"] == "wslm-share-8000"]
    assert legacy["id"].startswith("{")  # netsh gives it a GUID Name
    return legacy


@pytest.mark.parametrize("fw", LOCALES, indirect=True)
def test_rule_made_by_an_older_wslm_with_netsh_is_removed(fw, capsys) -> None:
    legacy = _legacy_rule(fw)
    [found] = firewall.wslm_rules()
    assert (found.name, found.legacy_id, found.port) == ("wslm-share-8000", legacy["id"], 8000)
    rc, st = run_json(capsys, "status")
    assert [r["name"] for r in st["rules"] if r["kind"] == "firewall"] == ["wslm-share-8000"]
    rc, off = run_json(capsys, "off")
    assert rc == 0 and off["applied"] and wslm_left(fw) == [] and fw.state["firewall"] == [FOREIGN_FW]


@pytest.mark.parametrize("fw", LOCALES, indirect=True)
def test_share_on_replaces_a_netsh_made_rule_and_rolls_back_to_it(fw, capsys, monkeypatch) -> None:
    monkeypatch.setenv("WSLM_ASSUME_ADMIN", "1")
    legacy = _legacy_rule(fw)
    fw.update(fail=["New-NetFirewallRule -Name 'wslm"])
    with pytest.raises(ApplyError) as err:
        share.share_on(8000)
    assert err.value.result["rollback_ok"]
    # Rolled back: the legacy rule is there again (re-made by netsh: same settings, a new GUID).
    [back] = [r for r in fw.state["firewall"] if r != FOREIGN_FW]
    assert {k: v for k, v in back.items() if k != "id"} == {k: v for k, v in legacy.items() if k != "id"}
    assert fw.state["portproxy"] == []
    fw.update(fail=[])
    rc, on = run_json(capsys, "on")
    assert rc == 0 and on["applied"]
    [rule] = [r for r in fw.state["firewall"] if r != FOREIGN_FW]
    assert rule["id"] == "wslm-share-8000"  # now a Name-based rule
    assert run_json(capsys, "off")[0] == 0 and wslm_left(fw) == []


@pytest.mark.parametrize("fw", ["de-DE"], indirect=True)
def test_fake_get_netfirewallrule_json_shapes(fw) -> None:
    """ConvertTo-Json: nothing for no rule, a bare object for one, a list for several."""
    def listed() -> str:
        proc = subprocess.run(firewall.list_argv(), capture_output=True, timeout=60)
        assert proc.returncode == 0
        return proc.stdout.decode().strip()

    assert listed() == ""
    fw.update(firewall=[dict(FOREIGN_FW, name="wslm-share-1", id="wslm-share-1")])
    assert json.loads(listed())["Name"] == "wslm-share-1"
    fw.update(firewall=[dict(FOREIGN_FW, name=f"wslm-share-{p}", id=f"wslm-share-{p}") for p in (1, 2)])
    assert [r["Name"] for r in json.loads(listed())] == ["wslm-share-1", "wslm-share-2"]
