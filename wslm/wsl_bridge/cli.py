"""`wslm wsl list|ip|mode` and `wslm share on|off|status|refresh|key`.

Exit codes: 0 success, 1 failure (message and fix on stderr, or as JSON with --json), 2 invalid
input (nothing was run), 3 administrator permission declined (nothing changed)."""

from __future__ import annotations

import argparse
import json
import sys


def _port(text: str) -> int:
    from wslm.wsl_bridge.errors import ValidationError
    from wslm.wsl_bridge.validate import validate_port

    try:
        return validate_port(text)
    except ValidationError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None


def _distro(text: str) -> str:
    from wslm.wsl_bridge.errors import ValidationError
    from wslm.wsl_bridge.validate import validate_distro

    try:
        return validate_distro(text)
    except ValidationError as exc:
        raise argparse.ArgumentTypeError(f"{exc.message} ({exc.fix})") from None


def register(subparsers: argparse._SubParsersAction) -> None:
    w = subparsers.add_parser("wsl", help="WSL distros, IP and networking mode")
    w.add_argument("what", choices=["list", "ip", "mode"], help="list distros, show a distro's IPv4, or its networking mode")
    w.add_argument("--distro", "-d", type=_distro, help="WSL distro (default: WSL's default)")
    w.add_argument("--json", action="store_true", help="machine-readable output")
    w.set_defaults(func=wsl_handler)

    s = subparsers.add_parser("share", help="share the backend on the LAN (portproxy + firewall)")
    s.add_argument("action", choices=["on", "off", "status", "refresh", "key"])
    s.add_argument("--port", "-p", type=_port, help="TCP port of the backend (default: last shared, else 8000)")
    s.add_argument("--distro", "-d", type=_distro, help="WSL distro running the backend (default: WSL's default)")
    s.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.add_argument("--show-key", "--show", dest="show_key", action="store_true", help="print the API key")
    s.add_argument("--take-over", action="store_true",
                   help="with `on`: replace a portproxy rule on the port that wslm did not create")
    s.add_argument("--regenerate", action="store_true", help="with `key`: make a new API key")
    s.set_defaults(func=share_handler)


def _emit(data: object, as_json: bool, text: str) -> None:
    print(json.dumps(data, indent=2) if as_json else text)


def _fail(exc: Exception, as_json: bool) -> int:
    from wslm.wsl_bridge.errors import BridgeError, ElevationCancelledError, ValidationError

    if not isinstance(exc, BridgeError):
        raise exc
    if as_json:
        data = exc.to_dict()
        if getattr(exc, "result", None):
            data["result"] = exc.result
        print(json.dumps(data, indent=2))
    else:
        print(f"wslm: error: {exc.message}", file=sys.stderr)
        if exc.fix:
            print(f"  fix: {exc.fix}", file=sys.stderr)
    if isinstance(exc, ValidationError):
        return 2
    return 3 if isinstance(exc, ElevationCancelledError) else 1


def wsl_handler(args: argparse.Namespace) -> int:
    from wslm.wsl_bridge import wsl
    from wslm.wsl_bridge.errors import BridgeError

    try:
        if args.what == "list":
            distros = wsl.list_distros()
            rows = [f"{'*' if d.default else ' '} {d.name:<24} {d.state:<12} {d.version}" for d in distros]
            _emit([d.to_dict() for d in distros], args.json, "\n".join([f"  {'NAME':<24} {'STATE':<12} VERSION", *rows]))
        elif args.what == "ip":
            distro = args.distro or wsl.default_distro().name
            ip = wsl.wsl_ip(distro)
            _emit({"distro": distro, "ip": ip}, args.json, ip)
        else:
            distro = args.distro or wsl.default_distro().name
            mode = wsl.networking_mode(distro)
            _emit({"distro": distro, "mode": mode}, args.json, mode)
    except BridgeError as exc:
        return _fail(exc, args.json)
    return 0


def _status_text(st) -> str:
    lines = [f"sharing: {'on' if st.enabled else 'off'}  (port {st.port}, distro {st.distro}, "
             f"{st.mode} networking, WSL IP {st.wsl_ip or '?'})"]
    if st.rules:
        lines.append("wslm rules:")
        for r in st.rules:
            target = f" -> {r.connect_address}:{r.connect_port}" if r.connect_address else ""
            flag = "  [STALE]" if r.stale else ""
            lines.append(f"  {r.kind:<9} {r.name}{target}{flag}" + (f"\n            {r.detail}" if r.detail else ""))
    else:
        lines.append("wslm rules: none")
    if st.lan_urls:
        lines.append("LAN URLs:" + "".join(f"\n  {u}" for u in st.lan_urls))
    lines.append(f"API key: {'set (`wslm share key --show` prints it)' if st.api_key_set else 'not generated yet'}")
    lines += [f"warning: {w}" for w in st.warnings]
    return "\n".join(lines)


def _result_text(res, show_key: bool) -> str:
    lines = list(res.messages)
    if res.status is not None:
        lines.append(_status_text(res.status))
    if res.server:
        key = res.server.get("api_key")
        lines.append(f"server: host {res.server['host']}, port {res.server['port']}, API key "
                     + (key if (show_key and key) else "hidden (--show-key)"))
    b = res.backend
    if b:
        if b.get("running") is False:
            lines.append("backend: not running. Start it with: wslm serve "
                         + " ".join(res.to_dict(show_key)["server"]["serve_args"]))
        elif b.get("restart_required"):
            lines.append(f"backend: RESTART REQUIRED: {b.get('reason')}")
        elif b.get("running"):
            lines.append(f"backend: listening on {', '.join(b.get('listen_addresses', []))}"
                         + (f" ({b['reason']})" if b.get("reason") else ""))
    return "\n".join(lines)


def share_handler(args: argparse.Namespace) -> int:
    from wslm.wsl_bridge import apikey, share
    from wslm.wsl_bridge.errors import BridgeError

    try:
        if args.action == "key":
            if args.regenerate:
                key, created = apikey.regenerate_api_key(), True
            else:
                key, created = apikey.ensure_api_key()
            data = {"api_key": key if args.show_key else share.HIDDEN, "created": created,
                    "path": str(apikey.api_key_path())}
            text = key if args.show_key else (f"API key {'generated' if created else 'set'} in {data['path']} "
                                              "(--show prints it; shared backends must restart after --regenerate)")
            _emit(data, args.json, text)
            return 0
        if args.action == "status":
            st = share.share_status(args.port, args.distro)
            _emit(st.to_dict(), args.json, _status_text(st))
            return 0
        if args.action == "on":
            res = share.share_on(args.port, args.distro, dry_run=args.dry_run, take_over=args.take_over)
        elif args.action == "off":
            res = share.share_off(args.port, dry_run=args.dry_run)
        else:
            res = share.share_refresh(args.port, args.distro, dry_run=args.dry_run)
        _emit(res.to_dict(show_key=args.show_key), args.json, _result_text(res, args.show_key))
        return 0
    except BridgeError as exc:
        return _fail(exc, args.json)
