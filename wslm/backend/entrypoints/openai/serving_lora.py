"""LoRA adapters served by name over the one base model (vLLM's serving_models.py): --lora-modules at start,
POST /v1/load_lora_adapter and /v1/unload_lora_adapter at run time (with VLLM_ALLOW_RUNTIME_LORA_UPDATING or
WSLM_ALLOW_RUNTIME_LORA_UPDATING set, as vLLM), a request's `model` naming an adapter, and each adapter in
/v1/models with the base as its `parent`."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from wslm import envs
from wslm.backend.entrypoints.openai.errors import APIError, bad_request
from wslm.backend.loader.lora import check_adapter
from wslm.backend.lora.request import LoRARequest

RUNTIME_VARS = ("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "WSLM_ALLOW_RUNTIME_LORA_UPDATING")


def parse_lora_module(spec: str) -> tuple[str, str, str | None]:
    """--lora-modules NAME=PATH or vLLM's JSON {"name", "path", "base_model_name"?}: (name, path, base name)."""
    if spec.lstrip().startswith("{"):
        try:
            item = json.loads(spec)
            return str(item["name"]), str(item["path"]), item.get("base_model_name")
        except (ValueError, KeyError, TypeError, AttributeError):
            raise ValueError(f"--lora-modules {spec}: JSON needs \"name\" and \"path\".") from None
    name, sep, path = spec.partition("=")
    if not sep or not name or not path:
        raise ValueError(f"--lora-modules {spec}: give NAME=PATH (or vLLM's JSON with name and path).")
    return name, path, None


def runtime_updates_allowed() -> bool:
    return any(envs.get(name) for name in RUNTIME_VARS)


class LoraRegistry:
    """The adapters a server serves, by name. Each load gets a new lora_int_id, so an adapter unloaded and
    loaded again from another folder never reuses the old one's resident weights or cached KV blocks."""

    def __init__(self, base: str, max_lora_rank: int, taken: set[str], validate: Any = None) -> None:
        """validate: the engine's check of an adapter against the model (lora.checks.AdapterChecker)."""
        self.base = base
        self.validate = validate
        self.max_lora_rank = max_lora_rank
        self.taken = taken  # names of the base and the pool's models: an adapter cannot take them
        self.adapters: dict[str, LoRARequest] = {}
        self._ids = itertools.count(1)

    def __contains__(self, name: object) -> bool:
        return name in self.adapters

    def get(self, name: Any) -> LoRARequest | None:
        return self.adapters.get(name) if isinstance(name, str) else None

    def add(self, name: str, path: str, base_model_name: str | None = None) -> LoRARequest:
        """ValueError naming the cause (a name in use, a folder that is no LoRA adapter, a rank too high);
        FileNotFoundError when the folder is not there."""
        if name in self.adapters or name in self.taken:
            raise ValueError(f"The lora adapter '{name}' has already been loaded." if name in self.adapters else
                             f"The name '{name}' is a model this server serves; give the adapter its own name.")
        folder = Path(path).expanduser()
        if not folder.is_dir():
            raise FileNotFoundError(f"No adapter found at {path}: give the folder peft's save_pretrained wrote.")
        check_adapter(folder, self.max_lora_rank)
        req = LoRARequest(name, next(self._ids), str(folder), base_model_name or self.base)
        if self.validate is not None:
            self.validate(req)  # its tensors fit the model: a bad adapter is refused now, not on each request
        self.adapters[name] = req
        return req

    def remove(self, name: str) -> LoRARequest:
        return self.adapters.pop(name)

    def card(self, req: LoRARequest, template: dict) -> dict:
        return {**template, "id": req.lora_name, "root": req.lora_path, "parent": req.base_model_name or self.base}


async def load_lora_adapter(state: Any, request: Request) -> Response:
    registry = _registry(state)
    body = await _body(request)
    name, path = body.get("lora_name"), body.get("lora_path")
    if not name or not path or not isinstance(name, str) or not isinstance(path, str):
        raise bad_request("Both 'lora_name' and 'lora_path' must be provided.", param="lora_name")
    try:
        registry.add(name, path, body.get("base_model_name"))
    except FileNotFoundError as exc:
        raise APIError(str(exc), 404, param="lora_path", code="NotFoundError") from exc
    except (ValueError, OSError) as exc:
        raise bad_request(str(exc), param="lora_path") from exc
    return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")


async def unload_lora_adapter(state: Any, request: Request) -> Response:
    registry = _registry(state)
    body = await _body(request)
    name = body.get("lora_name")
    if not name or not isinstance(name, str):
        raise bad_request("'lora_name' needs to be provided to unload a LoRA adapter.", param="lora_name")
    if name not in registry:
        raise APIError(f"The lora adapter '{name}' cannot be found.", 404, param="lora_name", code="NotFoundError")
    registry.remove(name)
    return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")


def _registry(state: Any) -> LoraRegistry:
    if not runtime_updates_allowed():
        raise APIError("Loading and unloading LoRA adapters at run time is off: start the server with "
                       "VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 (or WSLM_ALLOW_RUNTIME_LORA_UPDATING=1) and --enable-lora.",
                       404, code="NotFoundError")
    if state.lora is None:
        raise bad_request("This server serves no LoRA adapters: start it with --enable-lora.", param="lora_name")
    return state.lora


async def _body(request: Request) -> dict:
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise bad_request("Send a JSON object, e.g. {\"lora_name\": \"NAME\", \"lora_path\": \"/path/to/adapter\"}.")
    return body
