"""The weight formats (`quantization=`), the runtime weight forms they load to, and the one place the rest of
wslm asks about them.

Each format is a QuantMethod (method.py) in a file of its own (built in: methods/*.py; a format of your own:
any module that calls register_method, imported before the engine starts, or named in WSLM_QUANT_MODULES so
that worker processes import it too). Callers ask the registry: `--quantization` choices (method_names),
which format a checkpoint is (detect_method / stored_method), what a request runs as (resolve), the group
width tensor parallelism must keep (checkpoint_group), the GUI's options for a model (quantization_options).
Code outside wslm.backend.quant never switches on a format's name or a quantized weight's class: each
runtime form carries its `kind` and the hooks the engine asks of it (QuantizedWeight below); a plain
torch.Tensor is the dense form. Importing this module imports no torch (`wslm models` and the config parser
read it)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from importlib import import_module
from pathlib import Path
from typing import Any, Protocol

from wslm.backend.quant.method import QuantMethod

__all__ = [
    "DENSE", "METHODS", "QuantMethod", "QuantizedWeight", "WEIGHT_CLASSES", "checkpoint_group", "detect_method",
    "get_method", "method_names", "quantization_options", "quantizes_on_load", "register_method", "resolve",
    "stored_method", "unregister_method", "weight_class", "weight_kind",
]  # fmt: skip


class _Dense(QuantMethod):
    name = None
    description = "the checkpoint's 16/32-bit weights as they are"
    label = "auto (the model's own)"

    def choices(self) -> tuple[str, ...]:
        return tuple(m.name for m in METHODS.values() if m.on_the_fly and m.listed and m.name)


DENSE: QuantMethod = _Dense()

# Every registered method by name, built-in first in the order the CLI and error messages list them; dense
# (None) last. Filled by register_method.
METHODS: dict[str | None, QuantMethod] = {}

# Runtime weight classes by kind: (module, class name) imported on first use (they import torch), or a class.
WEIGHT_CLASSES: dict[str, tuple[str, str] | type] = {}

_BUILTIN = ("gguf", "awq", "gptq", "int8", "int4", "mxfp4")  # modules of wslm.backend.quant.methods
_plugins_loaded = False


def register_method(method: QuantMethod, weight_classes: dict[str, tuple[str, str] | type] | None = None,
                    replace: bool = False) -> QuantMethod:
    """Add a weight format: its method, and the runtime weight classes of the kinds it loads to (a class, or
    (module, class name) imported on first use). Call it when the format's module is imported, before the
    engine starts; returns the method. ValueError for a name or kind taken (unless replace)."""
    if not isinstance(method, QuantMethod):
        raise TypeError(f"register_method takes a QuantMethod, not {type(method).__name__}")
    if method.name is None and method is not DENSE:
        raise ValueError("a registered weight format needs a name (None is the dense checkpoint)")
    if not replace and method.name in METHODS and METHODS[method.name] is not method:
        raise ValueError(f"a weight format named {method.name!r} is registered already")
    for kind, cls in (weight_classes or {}).items():
        if not replace and kind in WEIGHT_CLASSES and WEIGHT_CLASSES[kind] != cls:
            raise ValueError(f"a runtime weight kind {kind!r} is registered already")
        WEIGHT_CLASSES[kind] = cls
    dense = METHODS.pop(None, None)
    METHODS[method.name] = method
    if dense is not None and method is not DENSE:
        METHODS[None] = dense  # dense stays last
    return method


def unregister_method(name: str) -> QuantMethod | None:
    """Remove a format of one's own (and its weight kinds) again; returns it, or None when none had that name.
    The built-in formats stay."""
    if name in _BUILTIN or name is None:
        raise ValueError(f"{name!r} is a built-in weight format")
    method = METHODS.pop(name, None)
    if method is not None:
        for kind in method.weight_kinds:
            if not any(kind in m.weight_kinds for m in METHODS.values()):
                WEIGHT_CLASSES.pop(kind, None)
    return method


def _load_plugins() -> None:
    """The modules named in WSLM_QUANT_MODULES (comma-separated), imported once: formats of one's own that a
    spawned process (tensor-parallel workers) registers as the parent did."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    from wslm import envs

    for name in filter(None, (n.strip() for n in (envs.WSLM_QUANT_MODULES or "").split(","))):
        try:
            import_module(name)
        except ImportError as e:
            raise ValueError(f"WSLM_QUANT_MODULES names {name!r}, which cannot be imported ({e}); fix the module "
                             "name or your PYTHONPATH.") from e


def _methods() -> dict[str | None, QuantMethod]:
    _load_plugins()
    return METHODS


class _Names(Sequence):
    """The `--quantization` choices, read live from the registry (a format registered after import counts)."""

    def _names(self) -> tuple[str, ...]:
        return tuple(n for n, m in _methods().items() if n is not None and m.listed)

    def __getitem__(self, i):  # type: ignore[override]
        return self._names()[i]

    def __len__(self) -> int:
        return len(self._names())

    def __eq__(self, other: object) -> bool:
        return tuple(self) == (tuple(other) if isinstance(other, (tuple, list, _Names)) else other)

    def __hash__(self) -> int:
        return hash(self._names())

    def __repr__(self) -> str:
        return repr(self._names())


def method_names() -> Sequence[str]:
    """The `--quantization` values, every listed format (a live view)."""
    return _Names()


def get_method(name: str | None) -> QuantMethod:
    """The method for a checked name (check_quantization's result); KeyError for any other."""
    return _methods()[name]


def quantizes_on_load(name: str | None) -> bool:
    """Whether `name` quantizes dense checkpoint weights while loading (int8 / int4)."""
    method = _methods().get(name)
    return method is not None and method.on_the_fly


def weight_class(kind: str) -> type:
    _methods()
    entry = WEIGHT_CLASSES[kind]
    if isinstance(entry, type):
        return entry
    module, cls = entry
    return getattr(import_module(module), cls)


def weight_kind(weight: Any) -> str:
    """The kind of a weight: "dense" for a plain tensor, else the quantized weight's ("int8", "int4", ...)."""
    kind = getattr(weight, "kind", None)
    return "dense" if kind is None else kind


# --- checkpoints ------------------------------------------------------------------------------------------


def detect_method(quant_config: dict | None, file_name: str | None = None) -> QuantMethod | None:
    """The format a checkpoint is stored in: by its model file's name (file_name, for a single-file model) or
    its config.json quantization_config; None for a 16/32-bit checkpoint. ValueError for a quantization_config
    no registered format reads."""
    for method in _methods().values():
        if method is not DENSE and method.detect(quant_config, file_name):
            return method
    found = str((quant_config or {}).get("quant_method") or "") if file_name is None else ""
    if found:
        readable = ", ".join(m.name for m in METHODS.values() if m.prequantized and m.listed and m.name)
        raise ValueError(f"Checkpoints quantized with {found!r} are not supported "
                         f"(supported: {readable}). Use the model's unquantized repo (with --quantization int8 or "
                         "int4 to shrink it) or a GGUF, or register a format of your own that reads it "
                         "(WSLM_QUANT_MODULES, docs/architecture.md).")
    return None


def read_quant_config(folder: Path) -> dict:
    """config.json's quantization_config of a checkpoint folder ({} when it has none)."""
    config = Path(folder) / "config.json"
    if not config.is_file():
        return {}
    return dict(json.loads(config.read_text()).get("quantization_config") or {})


def stored_method(source: Any) -> QuantMethod | None:
    """The format a ModelSource's checkpoint is stored in (None: 16/32-bit weights)."""
    if source.gguf_file:
        return detect_method(None, source.gguf_file)
    return detect_method(read_quant_config(source.folder) or None)


def resolve(requested: str | None, stored: QuantMethod | None, quant_config: dict | None = None) -> str | None:
    """What a checkpoint stored as `stored` runs as when `requested` (a checked name) is asked for: its own
    format, or an on-the-fly one it accepts; ValueError naming the fix otherwise."""
    asked = get_method(requested) if requested is not None else None
    if stored is None:
        if asked is not None and not asked.on_the_fly:
            raise ValueError(f"quantization={requested!r} was asked for, but the checkpoint has no {requested} "
                             f"weights. Leave --quantization unset, or use {' or '.join(DENSE.choices())}.")
        return requested
    stored.check_checkpoint(quant_config or {})
    return stored.resolve(asked)


def checkpoint_group(name: str | None, quant_config: dict | None = None) -> int | None:
    """The group width a checkpoint of format `name` keeps whole under tensor parallelism (QuantMethod.
    group_size); None for dense weights, unknown names and formats made on load."""
    method = _methods().get(name)
    return None if method is None else method.group_size(quant_config)


def quantization_options(stored: QuantMethod | None) -> list[dict[str, str]]:
    """The GUI's Quantization options for a model stored as `stored`: {"value", "label"}, unset ("") first."""
    options = [{"value": "", "label": DENSE.label}]
    for name in (stored or DENSE).choices():
        method = get_method(name)
        options.append({"value": name, "label": method.label or name})
    return options


def iter_registered() -> Iterator[QuantMethod]:
    yield from _methods().values()


class QuantizedWeight(Protocol):
    """What a runtime quantized weight offers (int8.Int8Weight, int4.Int4Weight, gguf_blocks.GGUFBlockWeight;
    linear.RowStack offers the first group only). Back ends that run their own code over the weights (the CPU
    decode back ends) read one thing of it: `kernel()`, its layout, buffers and sizes as a quant/kernel.py
    WeightKernel (or a string saying why it has none; then its own apply serves it on every path). A format of
    one's own needs only kind, bits, shape, nbytes, apply and dequantize (and `fuse(parts)` as a classmethod to
    keep q|k|v and gate|up fused in its own form, returning None where it cannot; without it they meet at int8:
    linear.fuse_rows); `kernel()` in a known layout gives it the fast paths."""

    kind: str
    bits: int

    @property
    def shape(self) -> Any: ...

    @property
    def nbytes(self) -> int: ...

    def apply(self, x: Any, bias: Any = None) -> Any: ...

    def dequantize(self, dtype: Any = ...) -> Any: ...

    def kernel(self) -> Any:
        """quant/kernel.py's WeightKernel of this weight, or why it has none (a string); optional."""
        ...


# Loading forms (int4.Int4Codes, int8.Int8Weight) also offer shard(dim, start, length) for tensor parallelism
# (shard.narrow), take_rows(rows) (GGUF's q/k order) and to_runtime(device, dtype) (linear.finalize); int8
# tables embedding(ids, dtype) and append_zero_rows(missing) (shard.pad_rows).

for _name in _BUILTIN:  # each registers itself (register_method) on import
    import_module(f"wslm.backend.quant.methods.{_name}")
register_method(DENSE)
