"""POST /v1/embeddings: one vector per input, batched by the engine (prefill only, nothing generated).

Inputs are embedded as sent. Instruction-tuned embedding models (Qwen3-Embedding, e5, bge with a query
prompt) expect the client to put the model card's instruction in front of queries, e.g.
"Instruct: Given a web search query, retrieve relevant passages that answer the query\\nQuery: <text>",
and documents as they are; the server never adds one (as vLLM, and OpenAI's API has no field for it)."""

from __future__ import annotations

import base64
import time
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from wslm.backend.entrypoints.openai.errors import APIError, bad_request
from wslm.backend.entrypoints.openai.protocol import EmbeddingRequest, parse_body
from wslm.backend.entrypoints.openai.serving_base import (
    ClientGone,
    ServerState,
    start_group,
    until_disconnect,
)
from wslm.backend.frontend.async_engine import Aborted, EngineFailure
from wslm.backend.outputs import PoolingRequestOutput
from wslm.backend.pooling_params import PoolingParams


async def create_embedding(state: ServerState, request: Request) -> Response:
    req: EmbeddingRequest = parse_body(await request.body(), EmbeddingRequest)
    model = state.check_model(req.model)
    state.check_not_draining()
    if state.task != "embed":
        raise bad_request(f"The model `{model}` generates text; it does not serve embeddings. Start `wslm serve` "
                          "with an embedding model (auto-detected, or --task embed).", param="model",
                          code="model_not_supported")
    inputs = req.inputs()
    keep = req.truncate_prompt_tokens
    if keep is not None and (keep == 0 or keep < -1):
        raise bad_request(f"truncate_prompt_tokens must be -1 (the model's context) or at least 1, got {keep}.",
                          param="truncate_prompt_tokens")
    if keep == -1 or (keep is not None and keep > state.max_model_len):
        keep = state.max_model_len
    prompts: list[Any] = []
    lower = _lower_case(state.engine)
    for item in inputs:
        if isinstance(item, str):  # tokenized off the event loop, with the model's special tokens
            prompts.append(await state.engine.encode(item.lower() if lower else item, max_length=keep))
        else:
            state.check_token_ids(item, "input")
            prompts.append(list(item)[-keep:] if keep else list(item))  # ids: the last `keep`, as vLLM
    params = PoolingParams(dimensions=req.dimensions, normalize=req.normalize)
    response_id = f"embd-{uuid.uuid4().hex}"
    group, _ = await start_group(state.engine, response_id, prompts, params)
    try:
        results = await until_disconnect(request, _collect(group, len(prompts)))
    except ClientGone:
        return Response(status_code=499)
    except EngineFailure as exc:
        raise APIError(str(exc), 500, type="server_error") from exc
    finally:
        group.abort()
    data = []
    tokens = 0
    for i, out in enumerate(results):
        vector = out.outputs.data
        tokens += len(out.prompt_token_ids)
        if req.encoding_format == "base64":  # little-endian float32, as OpenAI's (the client decodes it)
            embedding: Any = base64.b64encode(vector.float().numpy().astype("<f4").tobytes()).decode()
        else:
            embedding = vector.tolist()
        data.append({"index": i, "object": "embedding", "embedding": embedding})
    return JSONResponse({
        "id": response_id,
        "object": "list",
        "created": int(time.time()),
        "model": model,
        "data": data,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0,
                  "prompt_tokens_details": None},
    })


def _lower_case(engine: Any) -> bool:
    """sentence_bert_config.json's do_lower_case (vLLM lower-cases the text before tokenizing, as
    sentence-transformers does)."""
    inner = getattr(engine, "engine", None)
    pooler = getattr(inner, "pooler", None) or getattr(getattr(inner, "pooling", None), "pooler", None)
    return bool(getattr(pooler, "do_lower_case", False))


async def _collect(group: Any, count: int) -> list[PoolingRequestOutput]:
    results: list[PoolingRequestOutput | None] = [None] * count
    while not group.done:
        for tag, item in await group.next_items():
            if isinstance(item, EngineFailure):
                raise item
            if isinstance(item, Aborted):
                raise EngineFailure("The request was aborted: the server is shutting down.")
            if item.error or item.outputs is None:
                raise EngineFailure(item.error or "The engine failed on this input.")
            results[tag] = item
    return results  # type: ignore[return-value]
