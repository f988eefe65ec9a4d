"""Fake netsh.exe: portproxy v4tov4, excludedportrange, advfirewall firewall rules."""

from __future__ import annotations

import sys

from .common import ELEVATION_MSG, elevated, injected_failure, locked_state, out, record

NO_MATCH = "No rules match the specified criteria.\r\n"
NOT_FOUND = "The system cannot find the file specified.\r\n\r\n"


def _kv(args: list[str]) -> dict[str, str]:
    d = {}
    for a in args:
        k, sep, v = a.partition("=")
        if sep:
            d[k.lower()] = v
    return d


def _portproxy_table(rules: list[dict]) -> str:
    if not rules:
        return ""
    lines = ["", "Listen on ipv4:             Connect to ipv4:", "", "Address         Port        Address         Port",
             "--------------- ----------  --------------- ----------"]
    for r in rules:
        lines.append(f"{r['listen_address']:<16}{str(r['listen_port']):<12}{r['connect_address']:<16}{r['connect_port']}")
    return "\r\n".join(lines) + "\r\n\r\n"


def _rule_block(r: dict) -> str:
    rows = [("Rule Name:", r["name"]), None, ("Enabled:", "Yes" if r.get("enable", "yes") == "yes" else "No"),
            ("Direction:", r["dir"].capitalize()), ("Profiles:", ",".join(p.capitalize() for p in r["profile"].split(","))),
            ("Grouping:", ""), ("LocalIP:", "Any"),
            ("RemoteIP:", {"localsubnet": "LocalSubnet", "any": "Any"}.get(r["remoteip"].lower(), r["remoteip"])),
            ("Protocol:", r["protocol"].upper()), ("LocalPort:", r["localport"]), ("RemotePort:", "Any"),
            ("Edge traversal:", "No"), ("Action:", r["action"].capitalize())]
    lines = []
    for row in rows:
        lines.append("-" * 70 if row is None else f"{row[0]:<38}{row[1]}")
    return "\r\n".join(lines)


def _need_admin(st: dict) -> bool:
    if not elevated(st):
        out(ELEVATION_MSG)
        return True
    return False


def portproxy(st: dict, args: list[str]) -> int:
    verb = args[0].lower() if args else ""
    if verb == "show" and args[1:2] and args[1].lower() in ("v4tov4", "all"):
        out(_portproxy_table(st["portproxy"]))
        return 0
    if verb in ("add", "set", "delete") and args[1:2] == ["v4tov4"]:
        if _need_admin(st):
            return 1
        kv = _kv(args[2:])
        if "listenport" not in kv:
            out("The syntax supplied for this command is not valid. Check help for the correct syntax.\r\n\r\n")
            return 1
        la, lp = kv.get("listenaddress", "*"), int(kv["listenport"])
        existing = [r for r in st["portproxy"] if r["listen_address"] == la and r["listen_port"] == lp]
        if verb == "delete" or (verb == "set" and not existing):
            if not existing:
                out(NOT_FOUND)
                return 1
        if verb == "delete":
            st["portproxy"] = [r for r in st["portproxy"] if r not in existing]
            out("\r\n")
            return 0
        rule = {"listen_address": la, "listen_port": lp, "connect_address": kv.get("connectaddress", existing[0]["connect_address"] if existing else "127.0.0.1"),
                "connect_port": int(kv.get("connectport", lp))}
        if existing:  # add on an existing listen address/port replaces it, like set
            st["portproxy"][st["portproxy"].index(existing[0])] = rule
        else:
            st["portproxy"].append(rule)
        out("\r\n")
        return 0
    out("The following command was not found: interface portproxy " + " ".join(args) + ".\r\n")
    return 1


def excluded(st: dict) -> int:
    lines = ["", "Protocol tcp Port Exclusion Ranges", "", "Start Port    End Port", "----------    --------"]
    for start, end, admin in st["excluded"]:
        lines.append(f"{start:>10}  {end:>10}" + ("     *" if admin else ""))
    lines += ["", "* - Administered port exclusions.", "", ""]
    out("\r\n".join(lines))
    return 0


def firewall(st: dict, args: list[str]) -> int:
    verb = args[0].lower() if args else ""
    kv = _kv(args[2:])
    name = kv.get("name", "")
    if verb == "show" and args[1:2] == ["rule"]:
        rules = [r for r in st["firewall"] if (name.lower() == "all" or r["name"].lower() == name.lower())
                 and ("dir" not in kv or r["dir"] == kv["dir"].lower())]
        if not rules:
            out(NO_MATCH)
            return 1
        out("\r\n" + "\r\n\r\n".join(_rule_block(r) for r in rules) + "\r\nOk.\r\n\r\n")
        return 0
    if verb == "add" and args[1:2] == ["rule"]:
        if _need_admin(st):
            return 1
        if not name or name.lower() == "all" or "dir" not in kv or "action" not in kv:
            out("A specified value is not valid.\r\n\r\n")
            return 1
        st["firewall"].append({"name": name, "dir": kv["dir"].lower(), "action": kv["action"].lower(),
                               "protocol": kv.get("protocol", "any").lower(), "localport": kv.get("localport", "Any"),
                               "profile": kv.get("profile", "any").lower(), "remoteip": kv.get("remoteip", "any").lower(),
                               "enable": kv.get("enable", "yes").lower()})
        out("Ok.\r\n\r\n")
        return 0
    if verb == "delete" and args[1:2] == ["rule"]:
        if _need_admin(st):
            return 1
        gone = [r for r in st["firewall"] if r["name"].lower() == name.lower()]
        if not gone:
            out("\r\n" + NO_MATCH)
            return 1
        st["firewall"] = [r for r in st["firewall"] if r not in gone]
        out(f"\r\nDeleted {len(gone)} rule(s).\r\nOk.\r\n\r\n")
        return 0
    out("The following command was not found: advfirewall firewall " + " ".join(args) + ".\r\n")
    return 1


def main() -> int:
    args = sys.argv[1:]
    with locked_state() as st:
        record(st, "netsh.exe", args)
        if injected_failure(st, args):
            out("The parameter is incorrect.\r\n\r\n")
            return 1
        low = [a.lower() for a in args]
        if low[:2] == ["interface", "portproxy"]:
            return portproxy(st, args[2:])
        if low[:5] == ["interface", "ipv4", "show", "excludedportrange", "protocol=tcp"]:
            return excluded(st)
        if low[:2] == ["advfirewall", "firewall"]:
            return firewall(st, args[2:])
        out("The following command was not found: " + " ".join(args) + ".\r\n")
        return 1
