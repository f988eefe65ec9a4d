"""State shared by the fake Windows programs, kept in state.json beside them."""

from __future__ import annotations

import fcntl
import json
import os
import sys
import uuid
from contextlib import contextmanager
from pathlib import Path

DEFAULT_STATE: dict = {
    "distros": [
        {"name": "Ubuntu", "state": "Stopped", "version": 2, "default": True, "ip": "172.20.1.2",
         "mode": "nat", "has_wslinfo": True},
        {"name": "docker-desktop", "state": "Stopped", "version": 2, "default": False, "ip": "172.20.1.3",
         "mode": "nat", "has_wslinfo": True},
    ],
    "wsl_utf8_supported": True,  # the inbox wsl.exe of older Windows builds ignores WSL_UTF8
    "line_ending": "\r\n",  # "\r\r\n" when wsl.exe output went through a text-mode pipe
    "portproxy": [],  # {"listen_address", "listen_port", "connect_address", "connect_port"}
    # {"name" (DisplayName, netsh's "Rule Name"), "dir", "action", "protocol", "localport", "profile",
    #  "remoteip", "enable", "id" (Name; absent or a GUID for rules netsh/the GUI made)}
    "firewall": [],
    "hyperv": [],  # {"name", "port"}
    "excluded": [[1025, 1124, False], [50000, 50059, True]],
    "addresses": [
        {"InterfaceAlias": "Wi-Fi", "IPAddress": "192.168.1.23", "AddressState": "Preferred"},
        {"InterfaceAlias": "vEthernet (WSL (Hyper-V firewall))", "IPAddress": "172.20.0.1", "AddressState": "Preferred"},
        {"InterfaceAlias": "Loopback Pseudo-Interface 1", "IPAddress": "127.0.0.1", "AddressState": "Preferred"},
        {"InterfaceAlias": "Ethernet 2", "IPAddress": "169.254.10.20", "AddressState": "Preferred"},
    ],
    "profiles": [{"InterfaceAlias": "Wi-Fi", "NetworkCategory": "Private"}],
    "uac": "accept",  # "cancel": the user clicks No at the UAC prompt
    "admin": None,  # None: elevated when FAKE_WIN_ELEVATED=1 or WSLM_ASSUME_ADMIN=1; False: never
    "fail": [],  # substrings of a command line that make the command fail
    "calls": [],
    "locale": "en-US",  # Windows display language: netsh's text (labels, messages) and code page follow it
}

ELEVATION_MSG = "The requested operation requires elevation (Run as administrator).\r\n\r\n"


def state_path() -> Path:
    return Path(os.environ.get("FAKE_WINDOWS_STATE") or Path(sys.argv[0]).resolve().parent / "state.json")


def load_state(path: Path | None = None) -> dict:
    return json.loads(Path(path or state_path()).read_text())


def save_state(path: Path, state: dict) -> None:
    tmp = Path(str(path) + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(state, indent=1))
    os.replace(tmp, path)


@contextmanager
def locked_state():
    path = state_path()
    with open(str(path) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        st = load_state(path)
        yield st
        save_state(path, st)


def record(st: dict, program: str, args: list[str]) -> None:
    st["calls"].append([program, *args])


def elevated(st: dict) -> bool:
    if st.get("admin") is False:
        return False
    return os.environ.get("FAKE_WIN_ELEVATED") == "1" or os.environ.get("WSLM_ASSUME_ADMIN") == "1" or bool(st.get("admin"))


def injected_failure(st: dict, args: list[str]) -> bool:
    text = " ".join(args)
    return any(f in text for f in st.get("fail", []))


OEM_CODEPAGES = {"en-US": "cp437", "de-DE": "cp850", "zh-CN": "gbk"}
_oem = "cp437"


def use_locale(st: dict) -> str:
    """Select the OEM code page of the state's locale for out(); returns the locale."""
    global _oem
    locale = st.get("locale") or "en-US"
    _oem = OEM_CODEPAGES.get(locale, "cp437")
    return locale


def out(text: str, stream=None) -> None:
    """netsh writes CRLF text in the console's OEM code page (cp437, cp850, GBK...)."""
    (stream or sys.stdout).buffer.write(text.encode(_oem, errors="replace"))
    (stream or sys.stdout).flush()


def rule_id(rule: dict) -> str:
    """A firewall rule's Name: set by New-NetFirewallRule -Name; netsh (and the GUI) give a rule a
    GUID instead (stable here: derived from the entry when it has no "id")."""
    if rule.get("id"):
        return rule["id"]
    return "{" + str(uuid.uuid5(uuid.NAMESPACE_OID, json.dumps(rule, sort_keys=True))).upper() + "}"


def new_guid() -> str:
    return "{" + str(uuid.uuid4()).upper() + "}"


def split_windows_cmdline(cmdline: str) -> list[str]:
    """CommandLineToArgvW's rules (2n backslashes + quote -> n backslashes, quote toggles; 2n+1 -> literal)."""
    args, cur, in_quotes, i, have = [], [], False, 0, False
    while i < len(cmdline):
        ch = cmdline[i]
        if ch == "\\":
            j = i
            while j < len(cmdline) and cmdline[j] == "\\":
                j += 1
            n = j - i
            if j < len(cmdline) and cmdline[j] == '"':
                cur.append("\\" * (n // 2))
                if n % 2:
                    cur.append('"')
                    i = j + 1
                else:
                    i = j
                have = True
                continue
            cur.append("\\" * n)
            i, have = j, True
            continue
        if ch == '"':
            if in_quotes and i + 1 < len(cmdline) and cmdline[i + 1] == '"':
                cur.append('"')
                i += 2
                continue
            in_quotes, have = not in_quotes, True
            i += 1
            continue
        if ch in " \t" and not in_quotes:
            if have or cur:
                args.append("".join(cur))
            cur, have = [], False
            i += 1
            continue
        cur.append(ch)
        have = True
        i += 1
    if have or cur:
        args.append("".join(cur))
    return args
