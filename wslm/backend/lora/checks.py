"""The front end's check of a request's adapter, before it is queued: a LoRARequest, LoRA enabled, its folder
a PEFT LoRA adapter within max_lora_rank. Remembered per lora_int_id, so a folder is read once."""

from __future__ import annotations

from wslm.backend.errors import RequestError
from wslm.backend.loader.lora import check_adapter
from wslm.backend.lora.request import LoRARequest


class AdapterChecker:
    def __init__(self, enabled: bool, max_lora_rank: int) -> None:
        self.enabled = enabled
        self.max_lora_rank = max_lora_rank
        self._ok: dict[int, str] = {}  # lora_int_id -> the path checked

    def __call__(self, req: object) -> None:
        if not isinstance(req, LoRARequest):
            raise RequestError(f"lora_request must be a LoRARequest(lora_name, lora_int_id, lora_path), got "
                               f"{type(req).__name__}", param="lora_request")
        if not self.enabled:
            raise RequestError("This engine serves no LoRA adapters: start it with enable_lora=True "
                               "(`wslm serve --enable-lora`)", param="lora_request")
        if self._ok.get(req.lora_int_id) == req.lora_path:
            return
        try:
            check_adapter(req.lora_path, self.max_lora_rank)
        except (ValueError, OSError) as exc:
            raise RequestError(f"LoRA adapter {req.lora_name!r}: {exc}", param="lora_request",
                               code="invalid_lora") from exc
        self._ok[req.lora_int_id] = req.lora_path
