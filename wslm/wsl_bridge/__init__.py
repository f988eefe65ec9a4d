"""The Windows half of wslm: WSL control, launching `wslm` on the Linux side, port proxy, firewall
and one-click LAN sharing.

Modules (each documents its API):
- wsl: distros (`wsl.exe -l -v`), networking mode, the distro's eth0 IPv4.
- launcher: Target (local or a WSL distro), argv builder for `wslm ...`, streaming, reliable stop,
  port-in-use checks. Used by the GUI (QProcess) and `share`.
- share: share_on / share_off / share_status / share_refresh, returning dataclasses (to_dict() is
  the `--json` output).
- plan, elevated: unprivileged plans applied by one elevated helper (one UAC prompt), with rollback.
- portproxy, firewall, netinfo, ports: parsing and argv for netsh / PowerShell.
- apikey: the API key a shared backend requires. state: which Windows rules wslm owns.
- errors: every failure is a BridgeError with `message` and `fix`.

Environment: WSLM_WINDOWS_BIN=DIR (take wsl.exe, netsh.exe, powershell.exe from DIR and behave as
on Windows on any OS), WSLM_ASSUME_ADMIN=1 (treat the process as elevated; tests only),
WSLM_CONFIG_DIR (config folder). Importing this package loads only the standard library.
"""
