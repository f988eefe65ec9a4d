"""What wslm has added to Windows, kept in `config_dir()/share.json`. netsh cannot tag a portproxy
rule, so this record is how wslm tells its own rules from the user's; `share off` removes only what
is listed here (and firewall rules named "wslm...")."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from wslm import paths

KINDS = ("portproxy", "firewall", "hyperv")


@dataclass
class OwnedRule:
    kind: str  # "portproxy" | "firewall" | "hyperv"
    port: int
    name: str = ""  # firewall / Hyper-V rule name; "" for portproxy
    listen_address: str = ""
    connect_address: str = ""
    distro: str = ""

    def key(self) -> tuple:
        return (self.kind, self.name) if self.kind != "portproxy" else (self.kind, self.listen_address, self.port)


@dataclass
class ShareState:
    rules: list[OwnedRule]
    shares: dict[str, dict]  # str(port) -> {"distro": ..., "mode": ...}

    def owned(self, kind: str, port: int | None = None) -> list[OwnedRule]:
        return [r for r in self.rules if r.kind == kind and (port is None or r.port == port)]

    def put(self, rule: OwnedRule) -> None:
        self.rules = [r for r in self.rules if r.key() != rule.key()] + [rule]

    def drop(self, rule: OwnedRule) -> None:
        self.rules = [r for r in self.rules if r.key() != rule.key()]

    def last_share(self) -> tuple[int | None, str | None]:
        """(port, distro) of the most recent `share on`, for commands run without --port/--distro."""
        if not self.shares:
            return None, None
        port, info = list(self.shares.items())[-1]
        return int(port), info.get("distro") or None


def state_path() -> Path:
    return paths.config_dir() / "share.json"


def load() -> ShareState:
    try:
        data = json.loads(state_path().read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return ShareState([], {})
    rules = []
    for item in data.get("rules", []):
        try:
            if item.get("kind") in KINDS:
                rules.append(OwnedRule(**{k: item[k] for k in OwnedRule.__dataclass_fields__ if k in item}))
        except TypeError:
            continue
    return ShareState(rules, dict(data.get("shares", {})))


def save(state: ShareState) -> None:
    path = state_path()
    tmp = path.with_name(f".share.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps({"version": 1, "rules": [asdict(r) for r in state.rules], "shares": state.shares},
                              indent=2), encoding="utf-8")
    os.replace(tmp, path)  # atomic: a crash never leaves a half-written record


@contextmanager
def locked() -> Iterator[ShareState]:
    """Read-modify-write of share.json under an exclusive lock on share.json.lock: the CLI and the GUI may
    both change it at once, and a change made between another writer's load() and save() must not be lost.
    The state is saved when the block ends without an exception."""
    path = state_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name("share.json.lock"), "a+b") as lock_file:
        _lock(lock_file.fileno())
        try:
            state = load()
            yield state
            save(state)
        finally:
            _unlock(lock_file.fileno())


_LOCK_TIMEOUT_S = 30.0


def _lock(fd: int) -> None:
    if os.name == "nt":
        import msvcrt

        deadline = time.monotonic() + _LOCK_TIMEOUT_S
        while True:  # LK_LOCK itself gives up after 10 s; another wslm may hold it through a UAC prompt
            try:
                os.lseek(fd, 0, os.SEEK_SET)
                msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{state_path()} is locked by another wslm process (the app or a "
                                       "`wslm share` command); try again when it has finished.") from None
                time.sleep(0.05)
    else:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_EX)


def _unlock(fd: int) -> None:
    if os.name == "nt":
        import msvcrt

        os.lseek(fd, 0, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
    else:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_UN)
