"""One-click LAN sharing of a backend running in WSL.

    share_on(port=8000, distro=None, dry_run=False, take_over=False) -> ShareResult
    share_off(port=None, dry_run=False)               -> ShareResult  (port None: every wslm share)
    share_status(port=None, distro=None)              -> ShareStatus
    share_refresh(port=None, dry_run=False)           -> ShareResult  (cheap when nothing changed)

Each returns a dataclass whose to_dict() is what `--json` prints. Nothing here prints the API key:
ShareResult.server["api_key"] holds it for the caller (the GUI restarts the backend with
server["serve_args"]); to_dict(show_key=False) replaces it with "<hidden>".

NAT networking (the default): a portproxy rule 0.0.0.0:P -> <WSL eth0 IP>:P plus an inbound
firewall rule "wslm-share-P" (TCP P, Private profile, LocalSubnet). The WSL IP changes on every WSL
restart: status marks such rules stale and refresh re-points them (no UAC prompt when nothing is stale).
Mirrored networking: no portproxy; the firewall rule plus a Hyper-V firewall rule for the WSL VM.

The backend itself must listen on 0.0.0.0 inside WSL and require the API key: start it with
`launcher.start_backend(target, server["serve_args"])` (`wslm serve --host 0.0.0.0 --port P
--api-key KEY`). share_on checks what listens on the port inside WSL and reports in `backend`
whether it is running, with which host, whether it enforces our key, and `restart_required`.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field

from wslm import defaults
from wslm.wsl_bridge import apikey, firewall, netinfo, portproxy, ports, state, winexec, wsl
from wslm.wsl_bridge.errors import BridgeError, ShareConflictError, ValidationError
from wslm.wsl_bridge.launcher import Target, listening_addresses, serve_args_for_share
from wslm.wsl_bridge.plan import Plan, Step, apply_plan
from wslm.wsl_bridge.portproxy import ProxyRule
from wslm.wsl_bridge.validate import validate_distro, validate_port

DEFAULT_PORT = defaults.PORT
LISTEN_ADDRESS = "0.0.0.0"
HIDDEN = "<hidden>"


@dataclass
class RuleInfo:
    kind: str  # "portproxy" | "firewall" | "hyperv"
    name: str
    listen_address: str
    listen_port: int
    connect_address: str
    connect_port: int | None
    stale: bool = False
    detail: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class ShareStatus:
    mode: str
    distro: str
    port: int
    wsl_ip: str | None
    enabled: bool
    rules: list[RuleInfo]
    lan_urls: list[str]
    api_key_set: bool
    warnings: list[str] = field(default_factory=list)
    stale: bool = False

    def to_dict(self) -> dict:
        d = asdict(self)
        d["rules"] = [r.to_dict() for r in self.rules]
        return d


@dataclass
class ShareResult:
    action: str  # "on" | "off" | "refresh"
    dry_run: bool
    applied: bool  # whether Windows was changed
    plan: Plan
    status: ShareStatus | None
    messages: list[str] = field(default_factory=list)
    server: dict = field(default_factory=dict)  # host, port, api_key, serve_args (share on)
    backend: dict = field(default_factory=dict)  # running, listen_addresses, api_key, restart_required

    @property
    def restart_required(self) -> bool:
        return bool(self.backend.get("restart_required"))

    def to_dict(self, show_key: bool = False) -> dict:
        server = dict(self.server)
        if server and not show_key:
            server["api_key"] = HIDDEN if server.get("api_key") else None
            server["serve_args"] = [HIDDEN if a == self.server.get("api_key") else a
                                    for a in server.get("serve_args", [])]
        return {"action": self.action, "dry_run": self.dry_run, "applied": self.applied,
                "plan": self.plan.to_dict(), "status": self.status.to_dict() if self.status else None,
                "messages": self.messages, "server": server, "backend": self.backend,
                "restart_required": self.restart_required,
                "warnings": self.status.warnings if self.status else []}


# --- gathering what is there ----------------------------------------------------------------------

@dataclass
class _Context:
    port: int
    distro: wsl.Distro
    mode: str
    wsl_ip: str | None
    table: list[ProxyRule]
    owned: state.ShareState
    warnings: list[str]


def _defaults(port: int | None, distro: str | None) -> tuple[int, str | None]:
    """Explicit values, else the last `share on`'s, else 8000 / WSL's default distro (validated)."""
    if port is not None:
        port = validate_port(port)
    if distro is not None:
        distro = validate_distro(distro)
    last_port, last_distro = state.load().last_share()
    return (port if port is not None else last_port or DEFAULT_PORT), (distro or last_distro)


def _context(port: int, distro_name: str | None) -> _Context:
    winexec.require_windows("LAN sharing")
    d = wsl.get_distro(distro_name)
    warnings = []
    if d.version == 1:
        warnings.append(f"{d.name} is a WSL 1 distro: it shares Windows' network, no portproxy is needed "
                        f"(convert with `wsl --set-version {d.name} 2` for the supported setup)")
    mode = wsl.networking_mode(d.name)
    if mode not in ("nat", "mirrored"):
        warnings.append(f"WSL networking mode {mode!r} is not one wslm knows; treating it as NAT")
    ip = None
    try:
        ip = wsl.wsl_ip(d.name)
    except BridgeError:
        if mode != "mirrored":
            raise
    return _Context(port, d, "mirrored" if mode == "mirrored" else "nat", ip, portproxy.show_rules(),
                    state.load(), warnings)


def _proxy_in_table(ctx_table: list[ProxyRule], owned: state.OwnedRule) -> ProxyRule | None:
    for r in ctx_table:
        if r.listen_port == owned.port and r.listen_address == owned.listen_address:
            return r
    return None


def _collect_rules(ctx: _Context, ports_of_interest: set[int]) -> tuple[list[RuleInfo], list[str]]:
    rules, warnings = [], []
    for o in ctx.owned.owned("portproxy"):
        live = _proxy_in_table(ctx.table, o)
        if live is None:
            warnings.append(f"wslm's portproxy rule {o.listen_address}:{o.port} was removed outside wslm; "
                            f"run `wslm share on --port {o.port}` to restore it")
            continue
        stale, detail = False, ""
        if ctx.mode == "mirrored":
            stale, detail = True, "mirrored networking needs no portproxy; `wslm share on` removes it"
        elif ctx.wsl_ip and live.connect_address != ctx.wsl_ip:
            stale, detail = True, f"points at {live.connect_address}, WSL is now at {ctx.wsl_ip}; run `wslm share refresh`"
        rules.append(RuleInfo("portproxy", f"{live.listen_address}:{live.listen_port}", live.listen_address,
                              live.listen_port, live.connect_address, live.connect_port, stale, detail))
    names = {o.name.lower() for o in ctx.owned.owned("firewall")} | {firewall.rule_name(p) for p in ports_of_interest}
    for fw in firewall.wslm_rules():  # one PowerShell run for all names
        if fw.name.lower() in names:
            legacy = " (made by netsh; `wslm share on` replaces it)" if fw.legacy_id else ""
            rules.append(RuleInfo("firewall", fw.name, "*", fw.port, "", None, False,
                                  f"TCP {fw.port}, profile {fw.profile}, remote {fw.remoteip}{legacy}"))
    if ctx.mode == "mirrored" or ctx.owned.owned("hyperv"):
        for hv in firewall.hyperv_rules():
            rules.append(RuleInfo("hyperv", hv.name, "*", hv.port, "", None, False, "Hyper-V firewall, WSL VM"))
    return rules, warnings


def _enabled(rules: list[RuleInfo], port: int, mode: str) -> bool:
    kinds = {r.kind for r in rules if r.listen_port == port}
    need = {"firewall", "hyperv"} if mode == "mirrored" else {"portproxy", "firewall"}
    return need <= kinds


def _status_from(ctx: _Context) -> ShareStatus:
    interesting = {ctx.port} | {o.port for o in ctx.owned.rules}
    rules, warnings = _collect_rules(ctx, interesting)
    lan = netinfo.lan_addresses()
    warnings = ctx.warnings + warnings + netinfo.public_profile_warnings(lan)
    if not lan:
        warnings.append("Windows reports no LAN IPv4 address: other devices cannot reach this PC")
    enabled = _enabled(rules, ctx.port, ctx.mode)
    stale = any(r.stale for r in rules)
    return ShareStatus(mode=ctx.mode, distro=ctx.distro.name, port=ctx.port, wsl_ip=ctx.wsl_ip, enabled=enabled,
                       rules=rules, lan_urls=[f"http://{a.address}:{ctx.port}/v1" for a in lan],
                       api_key_set=apikey.read_api_key() is not None, warnings=warnings, stale=stale)


def share_status(port: int | None = None, distro: str | None = None) -> ShareStatus:
    """wslm's rules (including stale ones), LAN URLs and warnings for `port` (default: last share)."""
    port, distro = _defaults(port, distro)
    return _status_from(_context(port, distro))


# --- share on ---------------------------------------------------------------------------------------

def _firewall_steps(current: list[firewall.FirewallRule], desired: firewall.FirewallRule) -> list[Step]:
    """Steps from the rules now called desired.name to exactly one rule, named by Name, like `desired`."""
    if len(current) == 1 and not current[0].legacy_id and current[0].matches(desired):
        return []
    steps = []
    for r in current:
        why = "made by netsh, found only by its display name" if r.legacy_id else "its settings differ"
        steps.append(Step(f"replace firewall rule {r.name} ({why})", firewall.remove_argv(r), firewall.restore_argv(r)))
    steps.append(Step(f"allow inbound TCP {desired.port} from the local subnet on Private networks "
                      f"(firewall rule {desired.name})", firewall.add_argv(desired), firewall.delete_argv(desired.name)))
    return steps


def plan_share_on(ctx: _Context, take_over: bool = False) -> Plan:
    """The steps `share on` needs, given what is there (empty when everything is in place).
    `take_over`: replace portproxy rules on the same port that wslm did not create (e.g. the one the
    user made by hand before wslm); otherwise they are a ShareConflictError."""
    port, plan = ctx.port, Plan("share on")
    owned_proxy = [o for o in ctx.owned.owned("portproxy", port) if o.listen_address == LISTEN_ADDRESS]
    live = _proxy_in_table(ctx.table, owned_proxy[0]) if owned_proxy else None
    foreign = [r for r in ctx.table if r.listen_port == port and not (owned_proxy and r == live)]
    if foreign and take_over:
        for r in foreign:
            plan.steps.append(Step(f"remove the portproxy rule {r.listen_address}:{r.listen_port} -> "
                                   f"{r.connect_address}:{r.connect_port} (taken over by wslm)",
                                   portproxy.delete_argv(r), portproxy.add_argv(r)))
        foreign = []
    if ctx.mode == "nat" and foreign:
        r = foreign[0]
        raise ShareConflictError(
            f"port {port} is already forwarded by a portproxy rule wslm did not create: "
            f"{r.listen_address}:{r.listen_port} -> {r.connect_address}:{r.connect_port}",
            f"remove it (administrator): netsh interface portproxy delete v4tov4 listenport={r.listen_port} "
            f"listenaddress={r.listen_address}; or let wslm replace it: wslm share on --take-over; "
            f"or share another port with --port")
    if ctx.mode == "nat":
        if not ctx.wsl_ip:
            raise BridgeError(f"cannot find the IP of {ctx.distro.name}", "start the distro and try again")
        want = ProxyRule(LISTEN_ADDRESS, port, ctx.wsl_ip, port)
        if live is None:
            plan.steps.append(Step(f"forward {LISTEN_ADDRESS}:{port} to WSL {ctx.wsl_ip}:{port} (portproxy)",
                                   portproxy.add_argv(want), portproxy.delete_argv(want)))
        elif live.connect_address != ctx.wsl_ip or live.connect_port != port:
            plan.steps.append(Step(f"re-point portproxy {LISTEN_ADDRESS}:{port} from {live.connect_address} "
                                   f"to {ctx.wsl_ip}", portproxy.set_argv(want), portproxy.set_argv(live)))
    elif live is not None:
        plan.steps.append(Step(f"remove portproxy {LISTEN_ADDRESS}:{port} (mirrored networking needs none)",
                               portproxy.delete_argv(live), portproxy.add_argv(live)))
    name = firewall.rule_name(port)
    plan.steps += _firewall_steps(firewall.get_rules(name), firewall.FirewallRule(name=name, port=port))
    if ctx.mode == "mirrored" and not any(h.name == name for h in firewall.hyperv_rules()):
        plan.steps.append(Step(f"allow inbound TCP {port} into the WSL VM (Hyper-V firewall rule {name})",
                               firewall.hyperv_add_argv(name, port), firewall.hyperv_delete_argv(name)))
    return plan


def _record_on(ctx: _Context) -> None:
    port, distro = ctx.port, ctx.distro.name
    name = firewall.rule_name(port)
    with state.locked() as st:
        for o in st.owned("portproxy", port):
            st.drop(o)
        if ctx.mode == "nat":
            st.put(state.OwnedRule("portproxy", port, listen_address=LISTEN_ADDRESS,
                                   connect_address=ctx.wsl_ip or "", distro=distro))
        st.put(state.OwnedRule("firewall", port, name=name, distro=distro))
        if ctx.mode == "mirrored":
            st.put(state.OwnedRule("hyperv", port, name=name, distro=distro))
        st.shares.pop(str(port), None)
        st.shares[str(port)] = {"distro": distro, "mode": ctx.mode}


def probe_api_key(url: str, key: str | None, timeout: float = 3.0) -> str:
    """How the server at `url` (…/v1/models) treats API keys: "required" (rejects no key, accepts
    ours), "mismatch" (rejects ours), "missing" (accepts anyone) or "unknown" (no answer)."""
    def status(headers: dict) -> int | None:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as r:
                return r.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except (OSError, ValueError):
            return None

    anonymous = status({})
    if anonymous is None:
        return "unknown"
    if anonymous < 400:
        return "missing"
    if anonymous not in (401, 403):
        return "unknown"
    ours = status({"Authorization": f"Bearer {key}"}) if key else None
    return "required" if ours is not None and ours < 400 else "mismatch"


def backend_report(distro: str, port: int, probe_host: str | None, key: str | None) -> dict:
    """What listens on `port` inside the distro, and whether it must restart to be shared safely."""
    try:
        addrs = listening_addresses(Target.wsl(distro), port)
    except BridgeError as exc:
        return {"running": None, "listen_addresses": [], "api_key": "unknown", "restart_required": False,
                "reason": f"cannot check the backend: {exc.message}"}
    if not addrs:
        return {"running": False, "listen_addresses": [], "api_key": "unknown", "restart_required": False,
                "reason": f"no backend listens on port {port} in {distro}; start it with server.serve_args"}
    if not any(a in ("0.0.0.0", "::") for a in addrs):
        return {"running": True, "listen_addresses": addrs, "api_key": "unknown", "restart_required": True,
                "reason": f"the backend listens on {', '.join(addrs)} only; restart it with --host 0.0.0.0 "
                          f"--api-key (server.serve_args)"}
    key_state = probe_api_key(f"http://{probe_host}:{port}/v1/models", key) if probe_host else "unknown"
    reasons = {"missing": "the backend accepts requests without an API key; restart it with --api-key",
               "mismatch": "the backend uses a different API key; restart it with server.serve_args",
               "required": "", "unknown": "could not check the backend's API key"}
    return {"running": True, "listen_addresses": addrs, "api_key": key_state,
            "restart_required": key_state in ("missing", "mismatch"), "reason": reasons[key_state]}


def share_on(port: int | None = None, distro: str | None = None, dry_run: bool = False,
             check_backend: bool = True, take_over: bool = False) -> ShareResult:
    """Forward the port to the distro, open the firewall, make sure an API key exists, and report the
    LAN URLs, warnings and whether the backend must be (re)started with server["serve_args"]."""
    port, distro = _defaults(port, distro)
    if winexec.is_windows():
        excluded = ports.excluded_range_for(port)
        if excluded:
            raise ValidationError(f"port {port} is reserved by Windows (excluded port range {excluded[0]}-{excluded[1]}, "
                                  "usually Hyper-V or WinNAT)", "choose a port outside it with --port")
    ctx = _context(port, distro)
    plan = plan_share_on(ctx, take_over)
    messages = []
    if dry_run:
        key, created = apikey.read_api_key(), False
        if key is None:
            messages.append("an API key would be generated (`wslm share key` shows it afterwards)")
    else:
        key, created = apikey.ensure_api_key()
        if created:
            messages.append(f"generated an API key, stored in {apikey.api_key_path()} (`wslm share key --show`)")
        apply_plan(plan)
        _record_on(ctx)
        ctx.owned = state.load()
        ctx.table = portproxy.show_rules() if not plan.empty else ctx.table
    messages.append(plan.to_text() if dry_run else
                    ("already shared, nothing to change" if plan.empty else f"applied {len(plan.steps)} change(s)"))
    status = _status_from(ctx)
    server = {"host": LISTEN_ADDRESS, "port": port, "api_key": key,
              "serve_args": serve_args_for_share(port, key or HIDDEN)}
    backend = {}
    if check_backend:
        probe = ctx.wsl_ip if ctx.mode == "nat" else "127.0.0.1"
        backend = backend_report(ctx.distro.name, port, probe, key)
    return ShareResult("on", dry_run, bool(not dry_run and not plan.empty), plan, status, messages, server, backend)


# --- share off --------------------------------------------------------------------------------------

def plan_share_off(port: int | None) -> tuple[Plan, list[state.OwnedRule]]:
    """Steps that remove wslm's rules (for `port`, or all); no WSL access needed."""
    winexec.require_windows("LAN sharing")
    st, plan, gone = state.load(), Plan("share off"), []
    table = portproxy.show_rules() if st.owned("portproxy", port) else []
    for o in st.owned("portproxy", port):
        live = _proxy_in_table(table, o)
        if live:
            plan.steps.append(Step(f"remove portproxy {live.listen_address}:{live.listen_port} -> "
                                   f"{live.connect_address}:{live.connect_port}",
                                   portproxy.delete_argv(live), portproxy.add_argv(live)))
        gone.append(o)
    names = {o.name.lower() for o in st.owned("firewall", port)}
    if port is not None:
        names.add(firewall.rule_name(port))
    for fw in firewall.wslm_rules() if names else []:
        if fw.name.lower() in names:
            plan.steps.append(Step(f"remove firewall rule {fw.name}", firewall.remove_argv(fw),
                                   firewall.restore_argv(fw)))
    gone += st.owned("firewall", port)
    hv_names = {o.name for o in st.owned("hyperv", port)}
    if hv_names:
        for hv in firewall.hyperv_rules():
            if hv.name in hv_names:
                plan.steps.append(Step(f"remove Hyper-V firewall rule {hv.name}", firewall.hyperv_delete_argv(hv.name),
                                       firewall.hyperv_add_argv(hv.name, hv.port) if hv.port else None))
    gone += st.owned("hyperv", port)
    return plan, gone


def share_off(port: int | None = None, dry_run: bool = False) -> ShareResult:
    """Remove exactly what wslm added (for `port`, or every wslm share); other rules stay untouched.
    The API key is kept."""
    if port is not None:
        port = validate_port(port)
    plan, gone = plan_share_off(port)
    messages = [plan.to_text() if dry_run else ("nothing to remove" if plan.empty else
                                                 f"removed {len(plan.steps)} rule(s)")]
    if not dry_run:
        apply_plan(plan)
        with state.locked() as st:
            for o in gone:
                st.drop(o)
            for p in {o.port for o in gone} | ({port} if port else set()):
                st.shares.pop(str(p), None)
            if port is None:
                st.shares.clear()
    return ShareResult("off", dry_run, bool(not dry_run and not plan.empty), plan, None, messages)


# --- share refresh ----------------------------------------------------------------------------------

def share_refresh(port: int | None = None, distro: str | None = None, dry_run: bool = False) -> ShareResult:
    """Re-point wslm's portproxy rules at the distro's current IP. Does not start a stopped distro and
    runs nothing elevated when no rule is stale, so the GUI can call it on a timer."""
    if port is not None:
        port = validate_port(port)
    if distro is not None:
        validate_distro(distro)
    winexec.require_windows("LAN sharing")
    st, plan, messages = state.load(), Plan("share refresh"), []
    owned = [o for o in st.owned("portproxy", port) if distro is None or o.distro.lower() == distro.lower()]
    if not owned:
        messages.append("no wslm portproxy rules to refresh")
        return ShareResult("refresh", dry_run, False, plan, None, messages)
    distros = {d.name.lower(): d for d in wsl.list_distros()}
    table = portproxy.show_rules()
    ips: dict[str, str | None] = {}
    updated = []
    for o in owned:
        d = distros.get(o.distro.lower()) if o.distro else next((x for x in distros.values() if x.default), None)
        if d is None:
            messages.append(f"distro {o.distro!r} of the rule for port {o.port} is no longer installed; "
                            f"run `wslm share off --port {o.port}`")
            continue
        if not d.running:
            messages.append(f"{d.name} is not running; the rule for port {o.port} is refreshed when it starts")
            continue
        if d.name not in ips:
            ips[d.name] = wsl.wsl_ip(d.name)
        live, ip = _proxy_in_table(table, o), ips[d.name]
        if live is None:
            messages.append(f"wslm's portproxy rule for port {o.port} is gone; run `wslm share on --port {o.port}`")
            continue
        if live.connect_address != ip:
            want = ProxyRule(live.listen_address, live.listen_port, ip, live.connect_port)
            plan.steps.append(Step(f"re-point portproxy {live.listen_address}:{live.listen_port} from "
                                   f"{live.connect_address} to {ip}", portproxy.set_argv(want), portproxy.set_argv(live)))
            updated.append((o, ip))
    if dry_run:
        messages.append(plan.to_text())
    else:
        apply_plan(plan)
        if updated:
            with state.locked() as st:
                for o, ip in updated:
                    o.connect_address = ip
                    st.put(o)
        messages.append("all wslm rules point at the current WSL IP" if plan.empty and not updated else
                        f"re-pointed {len(plan.steps)} rule(s)")
    return ShareResult("refresh", dry_run, bool(not dry_run and not plan.empty), plan, None, messages)
