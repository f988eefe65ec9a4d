"""LoraManager: the worker's resident adapters over one base model.

Up to max_loras adapters are resident at once (their A and B beside the base's layers, weights.py); an
adapter a step needs is read from its folder then, and the least recently used one not in the step makes
room (the scheduler never puts more than max_loras adapters in one step). max_cpu_loras adapters stay parsed
in host memory as well on a GPU (vLLM's --max-cpu-loras), so that one evicted from the device comes back
without reading its file."""

from __future__ import annotations

import logging
from collections import OrderedDict

import torch

from wslm.backend.loader.lora import LoraAdapter, load_adapter
from wslm.backend.lora.layers import LoraBatch, LoraLinear, LoraState
from wslm.backend.lora.request import LoRARequest
from wslm.backend.lora.weights import AdapterWeights, base_layers, build_adapter

logger = logging.getLogger("wslm.lora")


class LoraManager:
    def __init__(self, model, max_loras: int, max_lora_rank: int, max_cpu_loras: int | None = None,
                 slot_kernel=None) -> None:
        """slot_kernel: the kernel over slot buffers (wslm/kernels lora_delta); None: on CUDA the Triton one
        (PyTorch's without triton), on CPU none (the stacked layout, layers.py)."""
        if max_loras < 1:
            raise ValueError(f"max_loras must be at least 1, got {max_loras}")
        self.model = model
        self.device = model.device
        self.max_loras = max_loras
        self.max_lora_rank = max_lora_rank
        self.max_cpu_loras = max(max_cpu_loras or max_loras, max_loras)
        self.state = LoraState()
        if slot_kernel is None and self.device.type == "cuda":
            from wslm.kernels.dispatch import selected_backend

            if selected_backend(self.device) == "triton":
                from wslm.kernels.triton_lora import lora_delta as slot_kernel
            else:
                from wslm.kernels.torch_lora import lora_delta as slot_kernel
        self.slotted = slot_kernel is not None
        self.hooks: dict[tuple, LoraLinear] = {}
        for key, linear in base_layers(model).items():
            hook = LoraLinear(self.state, linear, max_loras, max_lora_rank, slot_kernel)
            linear.lora = hook
            self.hooks[key] = hook
        self.resident: OrderedDict[int, tuple[int, AdapterWeights]] = OrderedDict()  # id -> (slot, weights); LRU
        self.host: OrderedDict[int, LoraAdapter] = OrderedDict()  # parsed adapters (GPU: max_cpu_loras)

    # ---- adapters ------------------------------------------------------------------------------
    def add(self, req: LoRARequest, keep: set[int] = frozenset()) -> int:
        """Make req's adapter resident (evicting the least recently used one outside keep); its slot."""
        if req.lora_int_id in self.resident:
            self.resident.move_to_end(req.lora_int_id)
            return self.resident[req.lora_int_id][0]
        parsed = self.host.pop(req.lora_int_id, None) or load_adapter(req.lora_path)
        weights = build_adapter(self.model, req.lora_int_id, req.lora_path, self.max_lora_rank, parsed)
        if self.slotted:
            self.host[req.lora_int_id] = parsed
            while len(self.host) > self.max_cpu_loras:
                self.host.popitem(last=False)
        used = {slot for slot, _ in self.resident.values()}
        if len(self.resident) >= self.max_loras:
            victim = next((i for i in self.resident if i not in keep), None)
            if victim is None:
                raise RuntimeError(f"more than max_loras={self.max_loras} adapters in one step")
            used.discard(self.remove(victim))
        slot = min(set(range(self.max_loras)) - used)
        for key, hook in self.hooks.items():
            hook.put(req.lora_int_id, slot, weights.layers.get(key))
        self.resident[req.lora_int_id] = (slot, weights)
        logger.info("LoRA adapter %s (id %d, rank %d) resident in slot %d: %.1f MB", req.lora_name,
                    req.lora_int_id, weights.rank, slot, weights.nbytes() / 1e6)
        return slot

    def remove(self, lora_int_id: int) -> int | None:
        """Drop a resident adapter; its slot (None when it was not resident)."""
        entry = self.resident.pop(lora_int_id, None)
        if entry is None:
            return None
        for hook in self.hooks.values():
            hook.drop(lora_int_id)
        return entry[0]

    def list_loras(self) -> list[int]:
        return list(self.resident)

    def nbytes(self) -> int:
        """Memory the adapters take beside the base (slot buffers on a GPU)."""
        return sum(h.nbytes() for h in self.hooks.values())

    # ---- steps ---------------------------------------------------------------------------------
    def begin_step(self, rows: list) -> bool:
        """Set up the hooks for a step: rows, (LoRARequest or None, tokens) per sequence in batch order
        (StepInputs.lora); False (nothing set) when no sequence of the step runs an adapter: the base's fast
        paths then serve it."""
        reqs = [req for req, _ in rows if req is not None]
        if not reqs:
            return False
        keep = {r.lora_int_id for r in reqs}
        for req in reqs:
            self.add(req, keep)
        row_ids: list[int] = []
        for req, n in rows:
            row_ids += [req.lora_int_id if req is not None else 0] * n
        batch = LoraBatch(torch.tensor(row_ids, dtype=torch.int64).to(self.device), frozenset(keep))
        if self.slotted:
            slots = {i: slot for i, (slot, _) in self.resident.items()}
            batch.token_slot = torch.tensor([slots.get(i, -1) for i in row_ids], dtype=torch.int32).to(self.device)
        self.state.batch = batch
        return True

    def end_step(self) -> None:
        self.state.batch = None

