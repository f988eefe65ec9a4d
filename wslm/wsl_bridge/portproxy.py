"""`netsh interface portproxy` v4tov4 rules: parse the real table, build add/set/delete argv.

netsh stores no tag with a portproxy rule, so wslm records the rules it adds in its state file
(see state.py); rules not recorded there are someone else's and are never changed."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from wslm.wsl_bridge import winexec
from wslm.wsl_bridge.validate import validate_ipv4, validate_port

# Rows of the "Address  Port  Address  Port" table; addresses may be IPs, "*" or host names.
_ROW_RE = re.compile(r"^\s*(\S+)\s+(\d{1,5})\s+(\S+)\s+(\d{1,5})\s*$")


@dataclass(frozen=True)
class ProxyRule:
    listen_address: str
    listen_port: int
    connect_address: str
    connect_port: int

    def to_dict(self) -> dict:
        return asdict(self)


def parse_v4tov4(text: str) -> list[ProxyRule]:
    """Rules from `netsh interface portproxy show v4tov4` (empty output means no rules)."""
    rules = []
    for line in text.splitlines():
        m = _ROW_RE.match(line)
        if m:
            rules.append(ProxyRule(m.group(1), int(m.group(2)), m.group(3), int(m.group(4))))
    return rules


def _netsh() -> str:
    return winexec.windows_tool("netsh.exe")


def show_argv() -> list[str]:
    return [_netsh(), "interface", "portproxy", "show", "v4tov4"]


def show_rules() -> list[ProxyRule]:
    result = winexec.run(show_argv(), timeout=30)
    if not result.ok:
        from wslm.wsl_bridge.errors import CommandError

        raise CommandError(f"netsh could not list portproxy rules: {result.output}",
                           "check that the IP Helper service (iphlpsvc) is running",
                           argv=result.argv, returncode=result.returncode, output=result.output)
    return parse_v4tov4(result.stdout)


def add_argv(rule: ProxyRule) -> list[str]:
    return [_netsh(), "interface", "portproxy", "add", "v4tov4",
            f"listenport={validate_port(rule.listen_port)}", f"listenaddress={validate_ipv4(rule.listen_address)}",
            f"connectport={validate_port(rule.connect_port)}", f"connectaddress={validate_ipv4(rule.connect_address)}"]


def set_argv(rule: ProxyRule) -> list[str]:
    """Re-point an existing rule (same listen address/port) at rule.connect_address:connect_port."""
    argv = add_argv(rule)
    argv[3] = "set"
    return argv


def delete_argv(rule: ProxyRule) -> list[str]:
    return [_netsh(), "interface", "portproxy", "delete", "v4tov4",
            f"listenport={validate_port(rule.listen_port)}", f"listenaddress={validate_ipv4(rule.listen_address)}"]
