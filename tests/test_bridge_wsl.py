"""WSL control and the launcher, through faithful fake wsl.exe/netsh.exe (WSLM_WINDOWS_BIN) and real
Linux processes (the fake wsl.exe runs the Linux side with bash on this machine, as WSL would)."""

from __future__ import annotations

import json
import socket
import sys
import textwrap
import time

import pytest
from fake_windows import use

from wslm.cli import main
from wslm.wsl_bridge import wsl
from wslm.wsl_bridge.errors import ValidationError, WslError
from wslm.wsl_bridge.launcher import Target, api_key_env, check_port, run_wslm, stop_backend


@pytest.fixture
def fw(monkeypatch, tmp_path):
    return use(monkeypatch, tmp_path)


def test_list_utf16_with_cr_cr_lf_when_wsl_utf8_is_ignored(fw, capsys) -> None:
    fw.update(wsl_utf8_supported=False, line_ending="\r\r\n")
    assert main(["wsl", "list", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [(d["name"], d["default"], d["version"], d["state"]) for d in data] == [
        ("Ubuntu", True, 2, "Stopped"), ("docker-desktop", False, 2, "Stopped")]
    assert fw.calls[-1] == ["wsl.exe", "-l", "-v"]


def test_default_distro_ip_and_mode(fw, tmp_path, capsys) -> None:
    assert wsl.default_distro().name == "Ubuntu"
    assert main(["wsl", "ip"]) == 0 and capsys.readouterr().out.strip() == "172.20.1.2"
    fw.set_distro("docker-desktop", mode="mirrored")
    assert main(["wsl", "mode", "--distro", "docker-desktop", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"distro": "docker-desktop", "mode": "mirrored"}
    # Without wslinfo (WSL < 2.0) the mode comes from %USERPROFILE%\.wslconfig.
    fw.set_distro("Ubuntu", has_wslinfo=False)
    assert wsl.networking_mode("Ubuntu") == "nat"
    (tmp_path / "profile").mkdir()
    (tmp_path / "profile" / ".wslconfig").write_text("[wsl2]\r\nnetworkingMode=mirrored\r\n")
    assert wsl.networking_mode("Ubuntu") == "mirrored"


def test_no_distros_and_unknown_distro(fw, capsys) -> None:
    with pytest.raises(WslError, match="not installed"):
        wsl.get_distro("Debian")
    with pytest.raises(WslError, match="not installed"):
        Target.wsl("Debian").run("true")
    fw.update(distros=[])
    assert main(["wsl", "list"]) == 1
    err = capsys.readouterr().err
    assert "no installed distributions" in err and "wsl --install" in err


def test_bad_distro_name_runs_nothing(fw, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["wsl", "ip", "--distro", "Ubuntu;reboot"])
    assert exc.value.code == 2
    assert "invalid WSL distro name" in capsys.readouterr().err
    with pytest.raises(ValidationError):
        Target.wsl("Ubuntu && rm -rf ~")
    assert fw.calls == []


def test_argv_quoting_survives_wsl_exe_and_the_linux_shell(fw) -> None:
    args = ["a b", "it's", 'say "hi"', "$HOME", "x;y|z&w", "tab\tand\nnewline", "", "C:\\Users\\J Doe", "ünï"]
    target = Target.wsl("Ubuntu")
    argv = target.program_argv(sys.executable, ["-c", "import json,sys; print(json.dumps(sys.argv[1:]))", *args])
    assert argv[:4] == [str(fw.dir / "wsl.exe"), "-d", "Ubuntu", "--"]
    result = target.run(sys.executable, ["-c", "import json,sys; print(json.dumps(sys.argv[1:]))", *args])
    assert result.ok, result.output
    assert json.loads(result.stdout) == args


def test_local_target_runs_this_python() -> None:
    assert Target.local().wslm_argv(["serve", "--port", "9"]) == [sys.executable, "-m", "wslm", "serve", "--port", "9"]
    assert Target.local(["/opt/wslm/bin/wslm"]).wslm_argv(["models", "list"]) == ["/opt/wslm/bin/wslm", "models", "list"]


FAKE_SERVE = textwrap.dedent("""
    import json, os, signal, sys, time
    if "--ignore-term" in sys.argv:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("log line on stderr", file=sys.stderr, flush=True)
    print(json.dumps({"event": "loading"}), flush=True)
    print(json.dumps({"event": "ready", "url": "http://127.0.0.1:8000", "host": "127.0.0.1", "port": 8000,
                      "model": "demo", "pid": os.getpid()}), flush=True)
    time.sleep(60)
""")


@pytest.mark.parametrize("via_wsl,ignore_term", [(True, False), (True, True), (False, True)])
def test_stream_ready_and_stop(fw, tmp_path, via_wsl: bool, ignore_term: bool) -> None:
    script = tmp_path / "fake serve.py"
    script.write_text(FAKE_SERVE)
    target = Target.wsl("Ubuntu", [sys.executable]) if via_wsl else Target.local([sys.executable])
    lines = []
    proc = run_wslm(target, [str(script), *(["--ignore-term"] if ignore_term else [])],
                    on_line=lambda stream, line: lines.append((stream, line)))
    ready = proc.wait_ready(timeout=20)
    assert ready is not None and ready.model == "demo" and ready.port == 8000
    assert [e["event"] for e in proc.events] == ["loading", "ready"]
    # stdout and stderr are read by separate threads: the stderr line may trail the ready event.
    deadline = time.monotonic() + 10
    while ("stderr", "log line on stderr") not in lines and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ("stderr", "log line on stderr") in lines
    started = time.monotonic()
    result = proc.stop(timeout=1.0)
    assert result is not None and result.exited
    assert result.signals == (["TERM", "KILL"] if ignore_term else ["TERM"])
    assert time.monotonic() - started < 10
    assert proc.poll() is not None
    # The Linux process itself is gone, not just wsl.exe.
    assert stop_backend(target, ready.pid, timeout=0.5).already_gone


def test_wait_ready_returns_none_when_the_process_exits(fw) -> None:
    proc = run_wslm(Target.wsl(None, [sys.executable]), ["-c", "print('no ready event')"])
    assert proc.wait_ready(timeout=20) is None
    assert proc.wait(timeout=20) == 0


def test_port_in_use_inside_wsl_and_windows_excluded_ranges(fw) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        st = check_port(Target.wsl("Ubuntu"), port)
        assert st.in_use and st.listeners == ["127.0.0.1"] and "already in use" in st.problems()[0]
        assert check_port(Target.local(), port).in_use
    st = check_port(Target.wsl("Ubuntu"), 50010)
    assert st.excluded_range == (50000, 50059) and not st.free and "reserved by Windows" in st.problems()[-1]


def test_api_key_env_passes_through_wslenv() -> None:
    env = api_key_env("k1", {"WSLENV": "FOO/u:WSLM_API_KEY", "PATH": "x"})
    assert env["WSLM_API_KEY"] == "k1" and env["WSLENV"] == "FOO/u:WSLM_API_KEY"
    assert api_key_env("k2", {})["WSLENV"] == "WSLM_API_KEY"
