"""Prometheus metrics for /metrics, written in the text exposition format by hand (no prometheus_client).

Names follow vLLM's (vllm:* -> wslm:*) so existing dashboards need only the prefix changed. Engine gauges and
counters come from LLMEngine.get_stats() snapshots taken on the engine thread; the latency histograms are
observed there too, as each request's tokens come out."""

from __future__ import annotations

import bisect
import threading

# Buckets as in vLLM.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)


class Histogram:
    def __init__(self, name: str, help_text: str, buckets: tuple[float, ...]) -> None:
        self.name = name
        self.help = help_text
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def render(self, labels: str) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        running = 0
        for bound, n in zip(self.buckets, self.counts, strict=False):
            running += n
            lines.append(f'{self.name}_bucket{{{labels},le="{_num(bound)}"}} {running}')
        lines.append(f'{self.name}_bucket{{{labels},le="+Inf"}} {self.count}')
        lines.append(f"{self.name}_sum{{{labels}}} {_num(self.sum)}")
        lines.append(f"{self.name}_count{{{labels}}} {self.count}")
        return lines


# (metric name, get_stats key, type, help)
_ENGINE_METRICS = (
    ("wslm:num_requests_running", "num_requests_running", "gauge", "Number of requests in the running batch."),
    ("wslm:num_requests_waiting", "num_requests_waiting", "gauge", "Number of requests waiting to be scheduled."),
    ("wslm:kv_cache_usage_perc", "kv_cache_usage", "gauge", "KV-cache usage: 1 means 100 percent of blocks used."),
    ("wslm:kv_cache_num_blocks", "num_blocks", "gauge", "Number of KV-cache blocks in the pool."),
    ("wslm:kv_cache_free_blocks", "num_free_blocks", "gauge", "Number of free KV-cache blocks."),
    ("wslm:prefix_cache_queries_total", "prefix_cache_queries", "counter",
     "Prefix-cache queries, in prompt tokens looked up."),
    ("wslm:prefix_cache_hits_total", "prefix_cache_hits", "counter", "Prefix-cache hits, in prompt tokens found."),
    ("wslm:prompt_tokens_total", "prompt_tokens_total", "counter", "Number of prefill tokens processed."),
    ("wslm:generation_tokens_total", "generation_tokens_total", "counter", "Number of generated tokens."),
    ("wslm:num_preemptions_total", "num_preemptions_total", "counter", "Number of preemptions (KV cache full)."),
)

# Speculative decoding's counters, under vLLM's own names (dashboards and the desktop app read them as they are);
# only while the engine speculates (EngineCore.get_stats has the keys then).
_SPEC_METRICS = (
    ("vllm:spec_decode_num_drafts_total", "spec_decode_num_drafts", "Speculative runs verified."),
    ("vllm:spec_decode_num_draft_tokens_total", "spec_decode_num_draft_tokens", "Tokens proposed."),
    ("vllm:spec_decode_num_accepted_tokens_total", "spec_decode_num_accepted_tokens", "Proposed tokens accepted."),
)


class ServerMetrics:
    """Histograms and request counters; observed on the engine thread, rendered on the HTTP thread."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self._lock = threading.Lock()
        self.ttft = Histogram("wslm:time_to_first_token_seconds", "Time to first token in seconds.", TTFT_BUCKETS)
        self.itl = Histogram("wslm:inter_token_latency_seconds", "Inter-token latency in seconds.", ITL_BUCKETS)
        self.e2e = Histogram("wslm:e2e_request_latency_seconds", "End-to-end request latency in seconds.",
                             E2E_BUCKETS)
        self.finished: dict[str, int] = {}  # finish reason -> count
        self.engine_stats: dict = {}
        # The engine core process died / was started again (frontend/core_restart.py; engine thread only).
        self.core_deaths = 0
        self.core_restarts = 0

    def observe_first_token(self, seconds: float) -> None:
        with self._lock:
            self.ttft.observe(seconds)

    def observe_tokens(self, seconds_per_token: float, num_tokens: int) -> None:
        with self._lock:
            for _ in range(num_tokens):
                self.itl.observe(seconds_per_token)

    def observe_finished(self, seconds: float, reasons: list[str]) -> None:
        with self._lock:
            self.e2e.observe(seconds)
            for reason in reasons:
                self.finished[reason] = self.finished.get(reason, 0) + 1

    def observe_finished_reason(self, reason: str) -> None:
        """A request that ended without an engine finish (aborted: client gone, or shutdown)."""
        with self._lock:
            self.finished[reason] = self.finished.get(reason, 0) + 1

    def set_engine_stats(self, stats: dict) -> None:
        self.engine_stats = stats  # replaced whole: readers see one consistent snapshot

    def render(self) -> str:
        labels = f'model_name="{_escape(self.model_name)}"'
        stats = self.engine_stats
        lines: list[str] = []
        for name, key, kind, help_text in _ENGINE_METRICS:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name}{{{labels}}} {_num(stats.get(key, 0))}"]
        for name, key, help_text in _SPEC_METRICS:
            if key in stats:
                lines += [f"# HELP {name} {help_text}", f"# TYPE {name} counter", f"{name}{{{labels}}} {stats[key]}"]
        queries, hits = stats.get("prefix_cache_queries", 0), stats.get("prefix_cache_hits", 0)
        lines += ["# HELP wslm:prefix_cache_hit_rate Prefix-cache hits over queries since start (0..1).",
                  "# TYPE wslm:prefix_cache_hit_rate gauge",
                  f"wslm:prefix_cache_hit_rate{{{labels}}} {_num(hits / queries if queries else 0.0)}"]
        for name, value, help_text in (
                ("wslm:engine_core_deaths_total", self.core_deaths, "Times the engine core process died."),
                ("wslm:engine_core_restarts_total", self.core_restarts,
                 "Times the engine core process was started again after it died.")):
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} counter", f"{name}{{{labels}}} {value}"]
        with self._lock:
            lines += ["# HELP wslm:request_success_total Finished requests, by finish reason.",
                      "# TYPE wslm:request_success_total counter"]
            for reason in sorted(set(self.finished) | {"stop", "length", "abort"}):
                lines.append(f'wslm:request_success_total{{{labels},finished_reason="{reason}"}} '
                             f"{self.finished.get(reason, 0)}")
            for hist in (self.ttft, self.itl, self.e2e):
                lines += hist.render(labels)
        return "\n".join(lines) + "\n"


def _num(value: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    return repr(float(value))


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
