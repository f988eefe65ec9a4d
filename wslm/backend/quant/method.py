"""QuantMethod: everything the rest of wslm asks of a weight format, answered by the format itself.

A format is one file that subclasses QuantMethod and calls wslm.backend.quant.registry.register_method
(the built-in ones are wslm/backend/quant/methods/*.py). The loader, tensor-parallel checks, `--quantization`
choices, `wslm models list` (the GUI's options, the hub catalog) read these answers; none of them branches on
a format's name. Importing this module imports no torch: a method's heavy parts are imported inside its hooks.

A format's checkpoint is found by `detect` (config.json's quantization_config, or the model file's suffix);
its tensors come out of `iter_weights` in the runtime forms its `weight_kinds` name (classes registered
with the method); those weights carry the compute hooks (registry.QuantizedWeight)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any


class QuantMethod:
    """One value of LLM(quantization=...) / --quantization (name None: dense), or a checkpoint format the
    engine reads without it being a choice (listed False: gpt-oss's MXFP4, dequantized on load).

    Subclasses set the class attributes and override the hooks they need; keyword arguments override
    attributes per instance (QuantMethod(name="x", description="...") for a plain entry)."""

    name: str | None = None
    description: str = ""
    label: str = ""  # the GUI's option text (default: the name)
    weight_kinds: tuple[str, ...] = ()  # runtime forms its quantized linear weights take (registry.weight_class)
    on_the_fly: bool = False  # quantizes a 16-bit checkpoint while it loads (quantize)
    prequantized: bool = False  # the checkpoint itself holds the format (detect finds it)
    listed: bool = True  # a `--quantization` choice
    checkpoint_names: tuple[str, ...] = ()  # config.json quantization_config.quant_method values it reads
    file_suffixes: tuple[str, ...] = ()  # model files that are this format whole (".gguf")

    def __init__(self, **fields: Any) -> None:
        for key, value in fields.items():
            if not hasattr(type(self), key):
                raise TypeError(f"QuantMethod has no field {key!r}")
            setattr(self, key, value)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    # --- finding it -------------------------------------------------------------------------------

    def detect(self, quant_config: dict | None, file_name: str | None) -> bool:
        """Whether a checkpoint is in this format: its config.json quantization_config (None when it has
        none), or the model file's name (a single-file format; None for a folder)."""
        if file_name is not None and self.file_suffixes:
            return file_name.lower().endswith(self.file_suffixes)
        method = str((quant_config or {}).get("quant_method") or "").lower()
        return bool(method) and method in self.checkpoint_names

    def check_checkpoint(self, quant_config: dict) -> None:
        """Raise ValueError naming the cause and the fix where this checkpoint's variant cannot load (bits,
        packing). Called once, before any weight is read."""

    def unsupported(self, quant_config: dict) -> str | None:
        """Why a checkpoint of this format cannot run, or None (what `wslm models list` shows)."""
        try:
            self.check_checkpoint(quant_config)
        except ValueError as e:
            return str(e)
        return None

    def resolve(self, requested: QuantMethod | None) -> str | None:
        """The quantization a checkpoint in this format runs as when `requested` was asked for (None: the
        flag was not given). Default for pre-quantized checkpoints: this format, and nothing else."""
        if requested is None or requested is self:
            return self.name
        raise ValueError(f"This checkpoint is {self.name}-quantized; quantization={requested.name!r} cannot apply "
                         "to it. Leave --quantization unset.")

    def choices(self) -> tuple[str, ...]:
        """The `--quantization` values (besides unset) that a checkpoint in this format accepts: what the
        GUI offers for the model."""
        return (self.name,) if self.listed and self.name else ()

    # --- tensor parallelism -----------------------------------------------------------------------

    def group_size(self, quant_config: dict | None) -> int | None:
        """The group width (input columns) its checkpoint's weights keep whole under tensor parallelism:
        every rank's share of a row-parallel layer must hold whole groups (wslm.tp_sizes). None: no such
        limit (dense, or groups made on load to fit each rank)."""
        return None

    # --- reading its tensors ----------------------------------------------------------------------

    def stored_bytes(self, source: Any) -> dict[str, int] | None:
        """Each weight's bytes in the model file by the name iter_weights yields it under (load progress),
        for a format that reads its own file; None: the folder's safetensors / .bin files are read."""
        return None

    def iter_weights(self, source: Any, dtype: Any, no_mmap: bool,
                     read: Callable[[], Iterator[tuple[str, Any]]] | None) -> Iterator[tuple[str, Any]]:
        """(checkpoint name, weight) for every weight, in a runtime form (a torch.Tensor, or a quantized weight
        of one of weight_kinds). `read` yields the folder's raw tensors (None where stored_bytes is not)."""
        if read is None:
            raise NotImplementedError(f"{self!r} reads its own file but has no iter_weights")
        return read()

    # --- quantizing on load -----------------------------------------------------------------------

    def quantize(self, weight: Any, is_table: bool = False, group_width: int | None = None) -> Any:
        """A 16-bit checkpoint tensor in this format (on_the_fly methods). is_table: an embedding / lm_head
        table (read by rows); group_width: the input width one rank holds (groups must not straddle ranks)."""
        raise TypeError(f"quantization={self.name!r} does not quantize weights while loading")

    # --- the hub catalog --------------------------------------------------------------------------

    def hub_label(self, quant_config: dict) -> str:
        """How `wslm models list` names a checkpoint's quantization ("awq-4bit")."""
        q = quant_config
        bits = q.get("bits") or q.get("w_bit") or (4 if q.get("load_in_4bit") else 8 if q.get("load_in_8bit") else None)
        method = str(q.get("quant_method") or self.name or "quantized")
        return f"{method}-{bits}bit" if bits else method
