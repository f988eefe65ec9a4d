"""POST /tokenize and /detokenize (vLLM's extra endpoints), on the model's own tokenizer."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse

from wslm.backend.entrypoints.openai.errors import bad_request
from wslm.backend.entrypoints.openai.protocol import DetokenizeRequest, TokenizeRequest, parse_body
from wslm.backend.entrypoints.openai.serving_base import ServerState
from wslm.backend.entrypoints.openai.serving_chat import render_prompt, template_messages


async def tokenize(state: ServerState, request: Request) -> JSONResponse:
    req: TokenizeRequest = parse_body(await request.body(), TokenizeRequest)
    state.check_model(req.model)
    if (req.prompt is None) == (req.messages is None):
        raise bad_request("Send either `prompt` (a string) or `messages` (a chat), not both and not neither.",
                          param="prompt")
    if req.messages is not None:
        tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
        ids = await render_prompt(state, template_messages(req.messages), chat_template=req.chat_template,
                                  add_generation_prompt=req.add_generation_prompt,
                                  continue_final_message=req.continue_final_message, tools=tools,
                                  chat_template_kwargs=req.chat_template_kwargs)
    else:
        add_special = True if req.add_special_tokens is None else req.add_special_tokens
        ids = await state.engine.encode(req.prompt, add_special_tokens=add_special)
    body = {"count": len(ids), "max_model_len": state.max_model_len, "tokens": ids, "token_strs": None}
    if req.return_token_strs:
        body["token_strs"] = state.tokenizer.convert_ids_to_tokens(ids)
    return JSONResponse(body)


async def detokenize(state: ServerState, request: Request) -> JSONResponse:
    req: DetokenizeRequest = parse_body(await request.body(), DetokenizeRequest)
    state.check_model(req.model)
    state.check_token_ids(req.tokens, "tokens")
    return JSONResponse({"prompt": state.tokenizer.decode(req.tokens)})
