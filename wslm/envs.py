"""Every WSLM_* environment variable wslm reads, in one table: name, type, default, what it does, and which
side reads it (engine, gui, bridge, install, tests).

Read them here, never with os.environ directly: `envs.WSLM_GGUF_CACHE` (or `envs.get("WSLM_GGUF_CACHE")`)
parses the variable when it is accessed, as vLLM's vllm/envs.py does, so a test's monkeypatch.setenv
takes effect, and a bad value raises EnvError naming the variable and what it allows. An empty value
counts as unset. docs/environment.md's tables are generated from this one
(`python -m wslm.envs --write docs/environment.md`; tests/test_envs.py checks they match).

OMP_WAIT_POLICY: importing the engine (`wslm.backend`, which loads no torch by itself) sets it to PASSIVE
unless it is set already (wslm/backend/__init__.py): it must be in place before torch loads libgomp, and
the CLI, the server and `LLM()` all benefit (spinning OpenMP threads make a CPU engine up to 10x slower
when anything else competes for the cores). `import wslm`, the GUI and the Windows bridge leave it alone.
Set OMP_WAIT_POLICY=ACTIVE before importing wslm.backend (or torch) to opt out.

Standard library only, and cheap to import: the GUI and the Windows bridge read it too."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TYPES = ("str", "path", "int", "float", "bool", "auto_bool", "choice")
SIDES = ("engine", "gui", "bridge", "install", "tests")
SECTIONS = (
    "Everyday",
    "Tuning (defaults are measured; see `docs/benchmarks.md`)",
    "Windows bridge and diagnostics",
    "Tests only",
)
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


class EnvError(ValueError):
    """A variable holds a value its type does not allow; the message names the variable and what it allows."""


@dataclass(frozen=True)
class EnvVar:
    name: str
    type: str  # one of TYPES
    default: Any  # the value when unset or empty
    doc: str  # one line (a Markdown table cell)
    sides: tuple[str, ...]  # who reads it, from SIDES
    section: str  # its table in docs/environment.md, from SECTIONS
    choices: tuple[str, ...] = ()  # "choice": the allowed values (lower case)
    minimum: int | None = None  # "int": the smallest allowed value
    default_doc: str = ""  # the default as the docs say it, where the value alone would mislead
    read_here: bool = True  # False: documented here, read outside the package (installer, tests, libgomp)

    def allowed(self) -> str:
        """What the variable takes, in words (error messages, the docs' type column)."""
        if self.type == "bool":
            return "1 or 0 (or true/false, yes/no, on/off)"
        if self.type == "auto_bool":
            return "auto, 1 or 0 (or true/false, yes/no, on/off)"
        if self.type == "choice":
            return " or ".join(repr(c) for c in self.choices)
        if self.type == "int":
            return "a whole number" + (f" >= {self.minimum}" if self.minimum is not None else "")
        if self.type == "float":
            return "a number above 0"
        return "a path" if self.type == "path" else "text"

    def parse(self, raw: str | None) -> Any:
        """The typed value of `raw` (None or blank: the default); EnvError for a value the type refuses."""
        value = (raw or "").strip()
        if not value:
            return self.default
        low = value.lower()
        if self.type == "str":
            return value
        if self.type == "path":
            return Path(value).expanduser()
        if self.type in ("bool", "auto_bool"):
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            if self.type == "auto_bool" and low == "auto":
                return None
        elif self.type == "choice":
            if low in self.choices:
                return low
        elif self.type == "int":
            try:
                number = int(value)
            except ValueError:
                number = None
            if number is not None and (self.minimum is None or number >= self.minimum):
                return number
        elif self.type == "float":
            try:
                number = float(value)
            except ValueError:
                number = None
            if number is not None and number > 0 and number != float("inf"):
                return number
        raise EnvError(f"{self.name}={raw!r} is not valid: use {self.allowed()}, or unset it.")

    def default_text(self) -> str:
        if self.default_doc:
            return self.default_doc
        if self.default is None:
            return "unset"
        if isinstance(self.default, bool):
            return "`1`" if self.default else "`0`"
        return f"`{self.default}`"


_E, _G, _B, _I, _T = SIDES
_EVERYDAY, _TUNING, _BRIDGE, _TESTS = SECTIONS

VARIABLES: tuple[EnvVar, ...] = (
    # Everyday
    EnvVar("WSLM_API_KEY", "str", None,
           "the key `wslm serve` requires on `/v1/*` when `--api-key` is not given. The GUI passes its key this "
           "way (into WSL through `WSLENV`) so it never shows in `ps` or a log.",
           (_E,), _EVERYDAY),
    EnvVar("VLLM_API_KEY", "str", None,
           "vLLM's name for the same key: `wslm serve` requires it when neither `--api-key` nor `WSLM_API_KEY` "
           "is given, so a vLLM launch script's environment keeps its server closed.",
           (_E,), _EVERYDAY),
    EnvVar("WSLM_ALLOW_RUNTIME_LORA_UPDATING", "bool", False,
           "`1` opens `POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter` on a `wslm serve --enable-lora` "
           "server (otherwise they answer 404).",
           (_E,), _EVERYDAY),
    EnvVar("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "bool", False,
           "vLLM's name for `WSLM_ALLOW_RUNTIME_LORA_UPDATING`; either one opens the endpoints.",
           (_E,), _EVERYDAY),
    EnvVar("WSLM_CONFIG_DIR", "path", None,
           "moves the config folder (settings, `share.json`); data and models follow it unless set apart.",
           (_E, _G, _B), _EVERYDAY, default_doc="the user config folder (platformdirs)"),
    EnvVar("WSLM_DATA_DIR", "path", None, "moves the data folder (chat database, logs).",
           (_G,), _EVERYDAY, default_doc="the user data folder (platformdirs)"),
    EnvVar("WSLM_MODELS_DIR", "path", None,
           "moves wslm's own models folder (`wslm models pull` without the HF cache). The desktop app's "
           "Settings → Models folder sets it for every `wslm` the app starts.",
           (_E,), _EVERYDAY, default_doc="`~/.wslm/models`"),
    EnvVar("WSLM_CACHE_DIR", "path", None,
           "moves the cache of converted GGUF copies (`wslm/backend/loader/gguf_cache.py`) and of the unpacked "
           "embedding model (`wslm/embed_model.py`).",
           (_E,), _EVERYDAY, default_doc="the user cache folder (platformdirs)"),
    EnvVar("WSLM_CPU_KVCACHE_SPACE", "float", None,
           "KV-cache pool on CPU in GiB (vLLM's `VLLM_CPU_KVCACHE_SPACE`); `--kv-cache-memory` wins over it.",
           (_E,), _EVERYDAY,
           default_doc="`--max-num-seqs` x `--max-model-len`, capped at the smaller of 2 GiB and 20% of the RAM "
                       "(`wslm/backend/platforms/cpu/kv_sizing.py`)"),
    EnvVar("WSLM_TORCH_SPEC", "str", None,
           "the torch requirement `./setup.sh` installs (e.g. a CUDA build: "
           "`\"torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128\"`). The installers' own "
           "variables are in `docs/install.md`.",
           (_I,), _EVERYDAY, default_doc="setup.sh's pinned torch", read_here=False),
    # Tuning
    EnvVar("WSLM_KERNEL_BACKEND", "choice", None,
           "overrides the kernel choice (Triton on CUDA, PyTorch on CPU).",
           (_E,), _TUNING, choices=("triton", "torch"), default_doc="auto"),
    EnvVar("WSLM_GGUF_DEQUANTIZE", "bool", False,
           "`1` loads a GGUF dequantized to float32, as transformers does (exact HF parity; 4-8x the memory).",
           (_E,), _TUNING),
    EnvVar("WSLM_QUANT_MODULES", "str", None,
           "Python modules (comma-separated) that register weight formats of your own "
           "(`wslm.backend.quant.registry.register_method`), imported wherever the engine looks formats up, worker "
           "processes included.",
           (_E,), _TUNING),
    EnvVar("WSLM_GGUF_CACHE", "bool", True, "`0`: no converted copy of a GGUF is written or read.",
           (_E,), _TUNING),
    EnvVar("WSLM_GGUF_BLOCKS", "bool", True,
           "`1` (the default): a GGUF's Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K/Q6_K weights stay the file's own "
           "blocks, pages of the memory-mapped file multiplied in place on CPU (`wslm/backend/quant/"
           "gguf_blocks.py`, `kernels/cpu_gguf.c`): a 3B file loads in ~3.5 s instead of ~35 s, holds the "
           "file's size, and its products are at least as fast as the repacked ones (2-core Zen 3, bench/"
           "gguf_blocks_vs_repacked.py; docs/benchmarks.md); MoE experts too, each read where it lies. `0`: "
           "repacked into int4 groups / int8 rows at load, as before (GPU engines still repack).",
           (_E,), _TUNING),
    EnvVar("WSLM_GGUF_PREFETCH", "bool", True,
           "`1` (the default): after a GGUF loads mapped, a background thread reads the file once so that its "
           "pages are in the page cache before requests need them (after a `wsl --shutdown` the cache is empty, "
           "and a mixture of experts would otherwise read each expert from disk the first time a token picks it); "
           "skipped when the file is larger than the memory available. `0`: pages are read when first used.",
           (_E,), _TUNING),
    EnvVar("WSLM_QUANT_FLOAT32", "bool", False,
           "`1`: with a float32 model on CPU, quantized weights reproduce the file's values exactly and multiply "
           "in float32: int4 keeps float32 scales (expanded to float32 for one GEMM per call), and the GGUF "
           "types the default would re-quantize to int8 (Q5_*, Q6_K, Q8_0, Q2_K/Q3_K, 4-bit embedding tables) "
           "load dequantized to float32 (4x those tensors' int8 size). Token for token with transformers' "
           "dequantized model, and bit-for-bit tensor-parallel parity; several times slower than the bf16 "
           "kernels, which are the default.",
           (_E,), _TUNING),
    EnvVar("WSLM_CPU_COMPILE", "auto_bool", None,
           "`auto`: compile the CPU decode step with torch.compile in the background when a C++ compiler exists "
           "and the layers' weights are under 1 GiB (the graph keeps a repacked copy of them; a second, "
           "one-sequence graph only where `WSLM_CPU_NATIVE_DECODE` cannot take those steps); `1`: compile "
           "whatever the size; `0`: never (as `--enforce-eager`).",
           (_E,), _TUNING, default_doc="`auto`"),
    EnvVar("WSLM_CPU_KERNELS", "bool", True,
           "`1`: build `wslm/kernels/cpu_gemv.c` and `cpu_layer.c` with the system's C compiler "
           "(`-march=native`, once, into the user cache) and run int8 / int4 decode rows on them (they read "
           "weights ahead; int4 takes a few rows at once reading each weight block once, 1.5-1.8x torch's "
           "kernel, also inside the compiled graph where torch runs AVX2 code; where the CPU has AVX2, or "
           "AVX512-VNNI and -VBMI, the int4 row multiplies the activation rounded to int8 per 32 columns, as "
           "llama.cpp does: ~1.7x faster than the float loop with AVX-512, 3-6x with AVX2; both of torch's int4 "
           "pack layouts are read, 64-row blocks where torch runs AVX-512 code and 32-row ones where it runs "
           "AVX2); `0`: torch's kernels only (and no `WSLM_CPU_NATIVE_DECODE`). Without a C compiler torch's "
           "kernels run.",
           (_E,), _TUNING),
    EnvVar("WSLM_CPU_KERNELS_CFLAGS", "str", "",
           "extra compiler flags for those kernels, after wslm's own (the last `-march` wins): e.g. "
           "`-march=haswell` builds the AVX2 loops a CPU without AVX-512 runs, to check or measure them on one "
           "that has it (`bench/quant.py --emulate-avx2`, `tests/test_cpu_native.py`). Part of the cache key.",
           (_E,), _TUNING, default_doc="none"),
    EnvVar("WSLM_CPU_NATIVE_DECODE", "bool", True,
           "`1`: a lone sequence's decode step (one chat) runs every layer in one C call "
           "(`wslm/backend/platforms/cpu/decode_native.py`) for Llama-shaped bfloat16 or float32 models "
           "(float32: dtype=auto on CPUs without bf16 arithmetic) whose weights are int4 (torch's pack), int8 "
           "or dense, with a KV cache of the model's dtype: the demo GGUF 95-104 -> ~186 tok/s on one core "
           "(bf16, AVX-512); with AVX2 and float32 ~25 -> ~80 tok/s. `0`: the compiled graph or the eager fast "
           "path instead.",
           (_E,), _TUNING),
    EnvVar("WSLM_CORE_PROCESS", "bool", True,
           "`1`: `wslm serve` runs each text-generation model's engine core (scheduler, executor, weights) in a "
           "child process of its own (`wslm/backend/engine/core_proc.py`); the server's process keeps HTTP, "
           "tokenizing and detokenizing, and a crash or out-of-memory kill of one model's core answers 503 for "
           "that model only (a pooled model is loaded again by its next request). `0`: the core runs in the "
           "server's own process, as `LLM()` does. Embedding and encoder models always run in-process.",
           (_E,), _TUNING),
    EnvVar("WSLM_CORE_START_METHOD", "choice", "fork",
           "how a core process starts: `fork` (the default: the server's imports come along; a tiny model's "
           "server was ready in 10.3 s against 11.5 s with the core in-process, median of 3 on a busy 2-core Zen "
           "3) or `spawn` / `forkserver` (a fresh interpreter that imports torch again: 19.4 s there). A process "
           "that already ran a model itself (an encoder, `WSLM_CORE_PROCESS=0`) starts its cores by spawn: "
           "OpenMP's threads do not survive a fork.",
           (_E,), _TUNING, choices=("fork", "spawn", "forkserver")),
    EnvVar("WSLM_CPU_FAST_DECODE", "bool", True,
           "`0` turns off the CPU fast decode path (`wslm/backend/platforms/cpu/decode_eager.py`: Llama-shaped "
           "models' decode steps with ~20 ops per layer instead of ~80, bit-identical to the general path); "
           "for bisecting only.",
           (_E,), _TUNING),
    EnvVar("WSLM_INT4_DENSE_ROWS", "int", 128,
           "from how many rows (prefill, big batches) int4 weights are expanded for one GEMM instead of "
           "torch's per-row kernel; `0`: always the kernel. Read at import.",
           (_E,), _TUNING, minimum=0),
    EnvVar("WSLM_INT8_DENSE_ROWS", "int", None,
           "the same for int8 weights. Read at import.",
           (_E,), _TUNING, minimum=0, default_doc="32 where the CPU has AMX, else 48"),
    EnvVar("WSLM_SMALL_STEP_ROWS", "int", 1,
           "CPU decode steps of up to this many sequences run on one intra-op thread while "
           "`OMP_WAIT_POLICY=PASSIVE`: waking sleeping OpenMP threads for each small op costs more than they "
           "add (a lone chat on 2 cores: 38 -> 74 tok/s eager). `0` turns it off. A lone sequence's step in C "
           "chooses its own count (`WSLM_CPU_STEP_THREADS`). Read at import.",
           (_E,), _TUNING, minimum=0),
    EnvVar("WSLM_CPU_STEP_THREADS", "int", 0,
           "threads for a lone sequence's decode step in C (`WSLM_CPU_NATIVE_DECODE`): `0` measures it, "
           "running on one thread or on all of torch's, whichever recent steps were faster, and trying the other "
           "now and then (a team of threads wins on an idle machine; one thread when other work keeps the "
           "cores busy); a number fixes it (at most torch's thread count). Read when a model loads.",
           (_E,), _TUNING, minimum=0, default_doc="0 (measured)"),
    EnvVar("OMP_WAIT_POLICY", "choice", "PASSIVE",
           "importing the engine (`wslm.backend`) sets `PASSIVE` unless you set it: spinning OpenMP threads collapse when another "
           "process competes for the cores; `ACTIVE` is faster on an idle machine.",
           (_E,), _TUNING, choices=("passive", "active"), read_here=False),
    # Windows bridge and diagnostics
    EnvVar("WSLM_WINDOWS_BIN", "path", None,
           "takes `wsl.exe`, `netsh.exe`, `powershell.exe` from this folder and behaves as on Windows (tests use "
           "faithful fakes).",
           (_B, _G), _BRIDGE),
    EnvVar("WSLM_ASSUME_ADMIN", "bool", False, "`1` treats the process as elevated (tests only).",
           (_B,), _BRIDGE),
    EnvVar("WSLM_INSTALL_SH", "path", None, "the `install.sh` the first-run dialog offers for a distro.",
           (_G,), _BRIDGE, default_doc="the bundled or checked-out one"),
    EnvVar("WSLM_DOCTOR_ROOT", "path", None,
           "`wslm doctor` checks a mounted system (or a test fixture) at this root from outside.",
           (_E,), _BRIDGE, default_doc="`/`"),
    # Tests only
    EnvVar("WSLM_TEST_FAULTS", "str", None,
           "injected engine faults (out of memory, a dead engine, a slow load) as a JSON object, read by the "
           "test executor `tests/fault_executor.py` (`--distributed-executor-backend fault_executor:FaultyExecutor`).",
           (_T,), _TESTS, read_here=False),
    EnvVar("WSLM_COMPILE_ALL", "bool", False,
           "`1`: `tests/test_kernels_compile.py` compiles for sm_80 and sm_86 too (by default sm_89 and sm_90).",
           (_T,), _TESTS, read_here=False),
)

BY_NAME: dict[str, EnvVar] = {v.name: v for v in VARIABLES}


def _var(name: str) -> EnvVar:
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"{name} is not a variable wslm knows; add it to wslm/envs.py's VARIABLES") from None


def get(name: str) -> Any:
    """The typed value of variable `name` now (its default when unset or blank); EnvError for a bad value."""
    return _var(name).parse(os.environ.get(name))


def raw(name: str) -> str | None:
    """The variable as set, stripped (None when unset or blank): for messages that quote it."""
    value = os.environ.get(_var(name).name, "").strip()
    return value or None


def is_set(name: str) -> bool:
    return raw(name) is not None


def __getattr__(name: str) -> Any:
    # `envs.WSLM_GGUF_CACHE` and the like read the environment on each access, like vllm.envs.
    if name in BY_NAME:
        return get(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *BY_NAME])


BEGIN_MARK = "<!-- BEGIN GENERATED by `python -m wslm.envs --write docs/environment.md`: edit wslm/envs.py -->"
END_MARK = "<!-- END GENERATED -->"


def markdown_table() -> str:
    """docs/environment.md's generated block: one table per section."""
    out: list[str] = []
    for section in SECTIONS:
        out += [f"## {section}", "| variable | takes | default | read by | what it does |", "|---|---|---|---|---|"]
        for v in VARIABLES:
            if v.section == section:
                cells = (f"`{v.name}`", v.allowed(), v.default_text(), ", ".join(v.sides), v.doc)
                out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def render_doc(text: str) -> str:
    """`text` (docs/environment.md) with the block between the markers replaced by markdown_table()."""
    start, end = text.find(BEGIN_MARK), text.find(END_MARK)
    if start < 0 or end < start:
        raise ValueError(f"the markers are missing: {BEGIN_MARK!r} ... {END_MARK!r}")
    return text[: start + len(BEGIN_MARK)] + "\n" + markdown_table() + text[end:]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--markdown"]:
        sys.stdout.write(markdown_table())
        return 0
    if len(args) == 2 and args[0] in ("--write", "--check"):
        path = Path(args[1])
        text = path.read_text(encoding="utf-8")
        new = render_doc(text)
        if args[0] == "--check":
            if new != text:
                print(f"{path} is out of date: run python -m wslm.envs --write {path}", file=sys.stderr)
                return 1
            return 0
        if new != text:
            path.write_text(new, encoding="utf-8")
        return 0
    print("usage: python -m wslm.envs --markdown | --write FILE | --check FILE", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
