"""Stand-ins for wsl.exe, netsh.exe and powershell.exe (Windows cannot exist here).

`install(directory, **state)` writes executables named exactly wsl.exe, netsh.exe, powershell.exe
into `directory` (plus Linux-side `ip` and `wslinfo` for the fake distros) and returns a FakeWindows
handle for reading and changing their shared state (state.json in the same folder). Output formats
and exit codes follow the real programs: UTF-16LE `wsl -l -v` (UTF-8 with WSL_UTF8=1), the netsh
portproxy/excludedportrange/firewall tables, "No rules match the specified criteria.", "The
requested operation requires elevation (Run as administrator).", translated on a de-DE or zh-CN
Windows (state "locale"), and Get-NetFirewallRule's JSON.

`wsl.exe -d D -- ARGS` behaves like the real one: it joins ARGS with spaces, wrapping an argument
that contains whitespace in double quotes, and runs the result with `bash -c` (here, on this machine,
with the fake `ip`/`wslinfo` first on PATH), so quoting bugs show up as they would on Windows.
"""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

from .common import DEFAULT_STATE, load_state, save_state

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

_PROGRAMS = {"wsl.exe": "wsl_exe", "netsh.exe": "netsh_exe", "powershell.exe": "powershell_exe"}
_LINUX = {"ip": "linux_tools:ip_main", "wslinfo": "linux_tools:wslinfo_main"}


def _write_stub(path: Path, module: str, func: str = "main") -> None:
    # -I -S: fast start-up, nothing from the environment's PYTHON* variables or site-packages.
    path.write_text(f"#!{sys.executable} -IS\n"
                    f"import sys\nsys.path.insert(0, {str(REPO)!r})\n"
                    f"from tests.fake_windows.{module} import {func}\n"
                    f"sys.exit({func}())\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


class FakeWindows:
    def __init__(self, directory: Path) -> None:
        self.dir = Path(directory)
        self.state_file = self.dir / "state.json"

    @property
    def state(self) -> dict:
        return load_state(self.state_file)

    def update(self, **changes: object) -> None:
        st = load_state(self.state_file)
        st.update(changes)
        save_state(self.state_file, st)

    def set_distro(self, name: str, **changes: object) -> None:
        st = load_state(self.state_file)
        for d in st["distros"]:
            if d["name"] == name:
                d.update(changes)
        save_state(self.state_file, st)

    @property
    def calls(self) -> list[list[str]]:
        return self.state["calls"]

    def clear_calls(self) -> None:
        self.update(calls=[])

    def changing_calls(self) -> list[list[str]]:
        """Calls that would change Windows (netsh add/set/delete, New/Remove-NetFirewall[HyperV]Rule)."""
        out = []
        for c in self.calls:
            text = " ".join(c[1:]).lower()
            if c[0] == "netsh.exe" and any(f" {v} " in f" {text} " for v in ("add", "set", "delete")):
                out.append(c)
            if c[0] == "powershell.exe" and any(v in text for v in ("new-netfirewallhypervrule", "remove-netfirewallhypervrule",
                                                                  "new-netfirewallrule", "remove-netfirewallrule")):
                out.append(c)
        return out


def install(directory: Path, **state: object) -> FakeWindows:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for name, module in _PROGRAMS.items():
        _write_stub(directory / name, module)
    linux = directory / "linux_bin"
    linux.mkdir(exist_ok=True)
    for name, spec in _LINUX.items():
        module, func = spec.split(":")
        _write_stub(linux / name, module, func)
    st = json.loads(json.dumps(DEFAULT_STATE))
    st.update(state)
    save_state(directory / "state.json", st)
    return FakeWindows(directory)


__all__ = ["FakeWindows", "install", "use"]


def use(monkeypatch, tmp_path: Path, **state: object) -> FakeWindows:
    """Install the fakes under tmp_path and point the bridge at them (for pytest tests)."""
    fw = install(tmp_path / "win bin", **state)  # a space in the path, as in "C:\\Program Files"
    monkeypatch.setenv("WSLM_WINDOWS_BIN", str(fw.dir))
    monkeypatch.setenv("WSLM_CONFIG_DIR", str(tmp_path / "config dir"))
    monkeypatch.setenv("USERPROFILE", str(tmp_path / "profile"))
    monkeypatch.delenv("WSLM_ASSUME_ADMIN", raising=False)
    monkeypatch.delenv("WSL_UTF8", raising=False)
    return fw
