"""Read the numbers the GUI shows from the server's Prometheus /metrics text."""

from __future__ import annotations

import re

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfNa]+)")


def parse_prometheus(text: str) -> dict[str, float]:
    """metric name -> value, summed over label sets (one model per server, so usually one each)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        out[m.group(1)] = out.get(m.group(1), 0.0) + value
    return out


def metric(values: dict[str, float], name: str, default: float = 0.0) -> float:
    """`name` without prefix: tries wslm:NAME, then vllm:NAME (works against a vLLM server too)."""
    for prefix in ("wslm:", "vllm:"):
        if prefix + name in values:
            return values[prefix + name]
    return default


class ThroughputMeter:
    """tokens/s from successive readings of a counter."""

    def __init__(self) -> None:
        self._last: tuple[float, float] | None = None

    def update(self, t: float, total: float) -> float | None:
        last, self._last = self._last, (t, total)
        if last is None or t <= last[0] or total < last[1]:
            return None
        return (total - last[1]) / (t - last[0])
