"""Fake netsh.exe: portproxy v4tov4, excludedportrange, advfirewall firewall rules.

Its text follows the state's "locale" (en-US, de-DE, zh-CN) as the real one follows Windows' display
language: translated labels and messages, in the OEM code page; numbers and addresses stay as they are."""

from __future__ import annotations

import sys

from .common import ELEVATION_MSG, elevated, injected_failure, locked_state, new_guid, out, record, use_locale

_TEXTS = {
    "en-US": {
        "no_match": "No rules match the specified criteria.\r\n",
        "not_found": "The system cannot find the file specified.\r\n\r\n",
        "elevation": ELEVATION_MSG,
        "ok": "Ok.",
        "deleted": "Deleted {n} rule(s).",
        "proxy_head": ["Listen on ipv4:             Connect to ipv4:", "",
                       "Address         Port        Address         Port"],
        "excluded_head": ["Protocol tcp Port Exclusion Ranges", "", "Start Port    End Port"],
        "excluded_note": "* - Administered port exclusions.",
        "labels": ["Rule Name:", "Enabled:", "Direction:", "Profiles:", "Grouping:", "LocalIP:", "RemoteIP:",
                   "Protocol:", "LocalPort:", "RemotePort:", "Edge traversal:", "Action:"],
        "yes": "Yes", "no": "No", "any": "Any", "in": "In", "out": "Out", "allow": "Allow", "block": "Block",
        "profiles": {"domain": "Domain", "private": "Private", "public": "Public"},
    },
    "de-DE": {
        "no_match": "Keine Regeln entsprechen den angegebenen Kriterien.\r\n",
        "not_found": "Das System kann die angegebene Datei nicht finden.\r\n\r\n",
        "elevation": "Für den angeforderten Vorgang sind erhöhte Rechte erforderlich (Als Administrator "
                     "ausführen).\r\n\r\n",
        "ok": "OK.",
        "deleted": "{n} Regel(n) gelöscht.",
        "proxy_head": ["Abfragen auf ipv4:             Verbinden mit ipv4:", "",
                       "Adresse         Anschluss   Adresse         Anschluss"],
        "excluded_head": ["Protokoll tcp Portausschlussbereiche", "", "Startport    Endport"],
        "excluded_note": "* - Verwaltete Portausschlüsse.",
        "labels": ["Regelname:", "Aktiviert:", "Richtung:", "Profile:", "Gruppierung:", "Lokale IP:", "Remote-IP:",
                   "Protokoll:", "Lokaler Port:", "Remoteport:", "Edgeausnahme:", "Aktion:"],
        "yes": "Ja", "no": "Nein", "any": "Beliebig", "in": "Eingehend", "out": "Ausgehend", "allow": "Zulassen",
        "block": "Blockieren", "profiles": {"domain": "Domäne", "private": "Privat", "public": "Öffentlich"},
    },
    "zh-CN": {
        "no_match": "没有与指定标准相匹配的规则。\r\n",
        "not_found": "系统找不到指定的文件。\r\n\r\n",
        "elevation": "请求的操作需要提升(作为管理员运行)。\r\n\r\n",
        "ok": "确定。",
        "deleted": "已删除 {n} 规则。",
        "proxy_head": ["侦听 ipv4:                 连接到 ipv4:", "", "地址            端口        地址            端口"],
        "excluded_head": ["协议 tcp 端口排除范围", "", "开始端口    结束端口"],
        "excluded_note": "* - 管理的端口排除。",
        "labels": ["规则名称:", "已启用:", "方向:", "配置文件:", "分组:", "本地 IP:", "远程 IP:", "协议:",
                   "本地端口:", "远程端口:", "边缘遍历:", "操作:"],
        "yes": "是", "no": "否", "any": "任何", "in": "入", "out": "出", "allow": "允许", "block": "阻止",
        "profiles": {"domain": "域", "private": "专用", "public": "公用"},
    },
}
T = _TEXTS["en-US"]


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
    lines = ["", *T["proxy_head"], "--------------- ----------  --------------- ----------"]
    for r in rules:
        lines.append(f"{r['listen_address']:<16}{str(r['listen_port']):<12}{r['connect_address']:<16}{r['connect_port']}")
    return "\r\n".join(lines) + "\r\n\r\n"


def _rule_block(r: dict) -> str:
    profiles = ",".join(T["profiles"].get(p, T["any"]) for p in r["profile"].split(","))
    remote = {"localsubnet": "LocalSubnet", "any": T["any"]}.get(r["remoteip"].lower(), r["remoteip"])
    values = [r["name"], T["yes"] if r.get("enable", "yes") == "yes" else T["no"], T.get(r["dir"], r["dir"]),
              profiles, "", T["any"], remote, r["protocol"].upper(),
              T["any"] if r["localport"].lower() == "any" else r["localport"], T["any"], T["no"],
              T.get(r["action"], r["action"])]
    lines = [f"{label:<38}{value}" for label, value in zip(T["labels"], values)]
    lines.insert(1, "-" * 70)
    return "\r\n".join(lines)


def _need_admin(st: dict) -> bool:
    if not elevated(st):
        out(T["elevation"])
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
                out(T["not_found"])
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
    lines = ["", *T["excluded_head"], "----------    --------"]
    for start, end, admin in st["excluded"]:
        lines.append(f"{start:>10}  {end:>10}" + ("     *" if admin else ""))
    lines += ["", T["excluded_note"], "", ""]
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
            out(T["no_match"])
            return 1
        out("\r\n" + "\r\n\r\n".join(_rule_block(r) for r in rules) + f"\r\n{T['ok']}\r\n\r\n")
        return 0
    if verb == "add" and args[1:2] == ["rule"]:
        if _need_admin(st):
            return 1
        if not name or name.lower() == "all" or "dir" not in kv or "action" not in kv:
            out("A specified value is not valid.\r\n\r\n")
            return 1
        # netsh sets only the DisplayName; the rule's Name (id) is a new GUID.
        st["firewall"].append({"id": new_guid(), "name": name, "dir": kv["dir"].lower(), "action": kv["action"].lower(),
                               "protocol": kv.get("protocol", "any").lower(), "localport": kv.get("localport", "Any"),
                               "profile": kv.get("profile", "any").lower(), "remoteip": kv.get("remoteip", "any").lower(),
                               "enable": kv.get("enable", "yes").lower()})
        out(f"{T['ok']}\r\n\r\n")
        return 0
    if verb == "delete" and args[1:2] == ["rule"]:
        if _need_admin(st):
            return 1
        # name= is the DisplayName: every rule showing it goes, whatever its Name.
        gone = [r for r in st["firewall"] if r["name"].lower() == name.lower()]
        if not gone:
            out("\r\n" + T["no_match"])
            return 1
        st["firewall"] = [r for r in st["firewall"] if r not in gone]
        out("\r\n" + T["deleted"].format(n=len(gone)) + f"\r\n{T['ok']}\r\n\r\n")
        return 0
    out("The following command was not found: advfirewall firewall " + " ".join(args) + ".\r\n")
    return 1


def main() -> int:
    global T
    args = sys.argv[1:]
    with locked_state() as st:
        T = _TEXTS[use_locale(st)]
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
