"""docs/benchmarks.md's table from the JSON results under bench/results/: the latest figure of each metric ×
model × threads, wslm against its peer (llama.cpp on a GGUF, transformers on a safetensors folder or for
batches), with the date and the machine it ran on.

    .venv/bin/python bench/summarize.py            # rewrite the table between the markers in docs/benchmarks.md
    .venv/bin/python bench/summarize.py --print    # print it only

Records (one JSON list per file; bench/realsize.py, bench/quant.py and bench/context.py write them) carry
metric, model, quant, threads, engine, value, unit, higher_is_better, date, machine; optional loadavg and, for
decode, roofline_pct (of the read bandwidth, or of the copy bandwidth in records without bandwidth_of).
The text outside the markers is kept as it is."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
DOC = ROOT / "docs" / "benchmarks.md"
START, END = "<!-- summary:start (bench/summarize.py writes this table) -->", "<!-- summary:end -->"
LABELS = {  # metric: what the row says; metrics not listed show their own name
    "decode_0": "decode tok/s, empty context",
    "decode_4k": "decode tok/s after a 4k context",
    "prefill_512": "prefill 512 tokens, s to first token",
    "prefill_2k": "prefill 2k tokens, s to first token",
    "prefill_1024": "prefill tok/s, 1024-token prompt",
    "load_warm": "load s, file in the page cache",
    "load_cold": "load s, page cache dropped",
    "load_first": "first load s (wslm: with the tokenizer conversion)",
    "rss_after_load": "resident after load",
    "peak_during_load": "peak resident during load",
    "rss_after_run": "resident after the runs (mapped pages touched)",
    "single_stream": "single stream tok/s",
    "concurrent_32": "32 concurrent chats, output tok/s",
}
ORDER = list(LABELS)
PEER_ORDER = ("llama.cpp", "transformers")


def load(folder: Path = RESULTS) -> list[dict]:
    records = []
    for path in sorted(folder.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            print(f"skipped {path}: {e}", file=sys.stderr)
            continue
        records += [dict(r, source=path.name) for r in (data if isinstance(data, list) else data.get("records", []))]
    return records


def machine_of(r: dict) -> str:
    return r.get("machine_short") or r.get("machine", "-").split(" (")[0]


def _key(r: dict) -> tuple:
    return (r.get("bench", ""), r["metric"], r["model"], r.get("quant", ""), r["threads"], machine_of(r), r["engine"])


def latest(records: list[dict]) -> dict[tuple, dict]:
    """The newest record per (bench, metric, model, quant, threads, machine, engine): machines that differ in
    their vector instructions get rows of their own."""
    out: dict[tuple, dict] = {}
    for r in records:
        key = _key(r)
        if key not in out or r.get("date", "") >= out[key].get("date", ""):
            out[key] = r
    return out


def same_run(records: list[dict], ours: dict, engine: str) -> dict | None:
    """The peer's record from the run (JSON file) that gave ours, when that run measured the peer too: a
    ratio of two runs compares two machine states."""
    want = _key(ours)[:-1] + (engine,)
    hits = [r for r in records if _key(r) == want and r.get("source") == ours.get("source")]
    return max(hits, key=lambda r: r.get("date", "")) if hits else None


def cell(r: dict | None) -> str:
    if r is None:
        return "-"
    v, unit = r["value"], r["unit"]
    if unit == "bytes":
        text = f"{v / 2**30:.2f} GiB"
        if r.get("file_backed") is not None and r.get("anonymous") is not None:
            text += f" ({r['file_backed'] / 2**30:.2f} file + {r['anonymous'] / 2**30:.2f} anon)"
        return text
    text = f"{v:.2f}" if v < 10 else f"{v:.1f}" if v < 100 else f"{v:.0f}"
    if r.get("roofline_pct") is not None:  # records before 2026-12-08 measured it against the copy bandwidth
        of = "read" if str(r.get("bandwidth_of", "")).startswith("read") else "copy"
        text += f" ({r['roofline_pct']:.0f}% of {of} roofline)"
    return text


def ratio(ours: dict | None, peer: dict | None) -> str:
    """How many times better wslm is (>1: wslm ahead), whichever way the metric points."""
    if not ours or not peer or not ours["value"] or not peer["value"]:
        return "-"
    r = ours["value"] / peer["value"] if ours.get("higher_is_better", True) else peer["value"] / ours["value"]
    return f"{r:.2f}x"


def table(records: list[dict]) -> str:
    best = latest(records)
    groups: dict[tuple, dict[str, dict]] = {}
    for (bench, metric, model, quant, threads, machine, engine), r in best.items():
        groups.setdefault((bench, model, quant, metric, threads, machine), {})[engine] = r

    def order(key: tuple) -> tuple:
        bench, model, quant, metric, threads, machine = key
        return (bench != "realsize", model, quant, machine, ORDER.index(metric) if metric in ORDER else 99, metric,
                threads)  # fmt: skip

    rows = ["| metric | model | threads | wslm | peer | peer's figure | wslm advantage | load avg | date | machine |",
            "|---|---|---:|---:|---|---:|---:|---:|---|---|"]  # fmt: skip
    for key in sorted(groups, key=order):
        bench, model, quant, metric, threads, machine = key
        engines = groups[key]
        ours = engines.get("wslm")
        peer_name = next((e for e in PEER_ORDER if e in engines), next((e for e in engines if e != "wslm"), None))
        peer = engines.get(peer_name) if peer_name else None
        if ours and peer_name:
            peer = same_run(records, ours, peer_name) or peer
        ref = ours or peer
        loads = [f"{r['loadavg']:.1f}" for r in (ours, peer) if r and r.get("loadavg") is not None]
        unit = "" if ref["unit"] in ("bytes", "tok/s", "s") else f" ({ref['unit']})"
        dates = ref.get("date", "-")
        if ours and peer and peer.get("date") != ours.get("date"):
            dates = f"{ours.get('date', '-')} / peer {peer.get('date', '-')}"  # two runs: say so
        rows.append(f"| {LABELS.get(metric, metric)}{unit} | {model} {quant}".rstrip() + f" | {threads} | {cell(ours)} | "
                    f"{peer_name or '-'} | {cell(peer)} | {ratio(ours, peer)} | {' / '.join(loads) or '-'} | "
                    f"{dates} | {machine} |")  # fmt: skip
    return "\n".join(rows)


TEMPLATE = f"""# Benchmarks

The current figures, one row per metric × model × threads, generated by `bench/summarize.py` from the JSON
results in `bench/results/`. The dated log of every run (older sections that README and code comments cite
by date) is `docs/benchmarks-log.md`.

{START}
{END}
"""


def write(doc: Path, text: str) -> None:
    current = doc.read_text() if doc.exists() else TEMPLATE
    if START not in current or END not in current:
        current = TEMPLATE + "\n" + current
    head, rest = current.split(START, 1)
    _, tail = rest.split(END, 1)
    doc.write_text(f"{head}{START}\n{text}\n{END}{tail}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--results", default=str(RESULTS))
    p.add_argument("--doc", default=str(DOC))
    p.add_argument("--print", action="store_true", help="print the table, change no file")
    args = p.parse_args()
    text = table(load(Path(args.results)))
    if args.print:
        print(text)
    else:
        write(Path(args.doc), text)
        print("written to", args.doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
