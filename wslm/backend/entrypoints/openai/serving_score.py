"""POST /score and /rerank (/v1/rerank, /v2/rerank): a cross-encoder (bge-reranker, ms-marco MiniLM)
scores each (query, document) pair, batched by the encoder engine. Scores are sigmoid(logit) in [0, 1], as
sentence-transformers' CrossEncoder.predict gives them."""

from __future__ import annotations

import time
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from wslm.backend.entrypoints.openai.errors import APIError, bad_request
from wslm.backend.entrypoints.openai.protocol import RerankRequest, ScoreRequest, parse_body
from wslm.backend.entrypoints.openai.serving_base import (
    ClientGone,
    ServerState,
    start_group,
    until_disconnect,
)
from wslm.backend.frontend.async_engine import Aborted, EngineFailure
from wslm.backend.pooling_params import PoolingParams


async def create_score(state: ServerState, request: Request) -> Response:
    req: ScoreRequest = parse_body(await request.body(), ScoreRequest)
    model = _check(state, req.model)
    response_id = f"score-{uuid.uuid4().hex}"
    scores, tokens = await _score(state, request, response_id, req.pairs())
    if scores is None:
        return Response(status_code=499)
    return JSONResponse({
        "id": response_id, "object": "list", "created": int(time.time()), "model": model,
        "data": [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0},
    })


async def create_rerank(state: ServerState, request: Request) -> Response:
    req: RerankRequest = parse_body(await request.body(), RerankRequest)
    model = _check(state, req.model)
    if req.top_n is not None and req.top_n < 0:
        raise bad_request(f"top_n must not be negative, got {req.top_n}.", param="top_n")
    response_id = f"rerank-{uuid.uuid4().hex}"
    scores, tokens = await _score(state, request, response_id, [(req.query, d) for d in req.documents])
    if scores is None:
        return Response(status_code=499)
    order = sorted(range(len(scores)), key=lambda i: scores[i], reverse=True)
    if req.top_n:
        order = order[: req.top_n]
    results = []
    for i in order:
        item: dict[str, Any] = {"index": i, "relevance_score": scores[i]}
        if req.return_documents:
            item["document"] = {"text": req.documents[i]}
        results.append(item)
    return JSONResponse({"id": response_id, "model": model, "usage": {"total_tokens": tokens}, "results": results})


def _check(state: ServerState, requested: str | None) -> str:
    model = state.check_model(requested)
    state.check_not_draining()
    if state.task != "score":
        raise bad_request(f"The model `{model}` is not a cross-encoder; /score and /rerank need one (such as "
                          "bge-reranker). For similarity with an embedding model, compare /v1/embeddings vectors.",
                          param="model", code="model_not_supported")
    return model


async def _score(state: ServerState, request: Request, response_id: str, pairs: list[tuple[str, str]]
                 ) -> tuple[list[float] | None, int]:
    prompts = [{"text": q, "text_pair": d} for q, d in pairs]
    group, _ = await start_group(state.engine, response_id, prompts, PoolingParams())
    try:
        outputs = await until_disconnect(request, _collect(group, len(prompts)))
    except ClientGone:
        return None, 0
    except EngineFailure as exc:
        raise APIError(str(exc), 500, type="server_error") from exc
    finally:
        group.abort()
    return [float(o.outputs.data[0]) for o in outputs], sum(len(o.prompt_token_ids) for o in outputs)


async def _collect(group: Any, count: int) -> list:
    results: list = [None] * count
    while not group.done:
        for tag, item in await group.next_items():
            if isinstance(item, EngineFailure):
                raise item
            if isinstance(item, Aborted):
                raise EngineFailure("The request was aborted: the server is shutting down.")
            if item.error or item.outputs is None:
                raise EngineFailure(item.error or "The engine failed on this pair.")
            results[tag] = item
    return results
