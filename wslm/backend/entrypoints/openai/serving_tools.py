"""A chat request's tools, tool_choice and parallel_tool_calls, and the server's reasoning parser: what the chat
template is given, which grammar (if any) forces the reply, and how each choice's reply is taken apart.

tool_choice follows OpenAI and vLLM: "none" (tools shown to the template, replies are plain text), "auto"
(the model may call; needs a tool-call parser: --tool-call-parser, or one picked from the chat template),
"required" (at least one call: a grammar forces a JSON array of {"name", "parameters"}, as vLLM's) and
{"type": "function", "function": {"name": ...}} (a grammar forces that function's arguments)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from wslm.backend.entrypoints.openai.chat_reply import ChatReply
from wslm.backend.entrypoints.openai.errors import bad_request
from wslm.backend.entrypoints.openai.reasoning import (
    REASONING_PARSERS,
    THINK_END,
    get_reasoning_parser,
    prompt_opens_think,
)
from wslm.backend.entrypoints.openai.tool_parsers import (
    ArrayToolParser,
    NamedFunctionParser,
    ToolParser,
    get_tool_parser,
    is_special_token,
)
from wslm.backend.structured.params import StructuredOutputsParams
from wslm.backend.structured.reasoning import after_reasoning

_ANY_OBJECT = {"type": "object"}


@dataclass
class ChatPlan:
    template_tools: list[dict] | None  # what the chat template's `tools` variable holds
    grammar: StructuredOutputsParams | None  # forces the reply for required / named tool_choice
    tool_parser: ToolParser | None
    parallel_tool_calls: bool
    reasoning_parser: str | None
    keep_special_tokens: bool = False  # the parser's markers are special tokens: keep them in the text
    think_opened: bool = False  # the rendered prompt ends inside an open think block
    think_closed: bool = False  # the prompt closed an empty think block (enable_thinking false): no reasoning
    structured_param: str | None = None  # the request field the grammar came from (errors name it)
    named: bool = False  # tool_choice names one function (OpenAI then finishes with "stop", not "tool_calls")

    def prompt_rendered(self, tokenizer: Any, prompt_ids: list[int]) -> None:
        if self.reasoning_parser:
            tail = tokenizer.decode(prompt_ids[-16:])
            self.think_opened = prompt_opens_think(tail)
            self.think_closed = tail.rstrip().endswith(THINK_END)

    def after_reasoning(self, spec: StructuredOutputsParams) -> StructuredOutputsParams:
        """A structured-output constraint (the client's, or the one forcing a tool call), applied after the
        reply's think block when the model reasons (as vLLM applies it once reasoning ends)."""
        if not self.reasoning_parser or self.think_closed or not REASONING_PARSERS[self.reasoning_parser].think_tags:
            return spec
        return after_reasoning(spec, REASONING_PARSERS[self.reasoning_parser].always_inside or self.think_opened)

    def new_reply(self) -> ChatReply:
        """A fresh parser for one choice's reply: reasoning, then tool calls."""
        reasoning = None
        if self.reasoning_parser:
            # A prompt that closed the think block leaves only a block the reply itself opens (qwen3's reading),
            # even for a parser whose replies otherwise start inside one.
            name = "qwen3" if self.think_closed else self.reasoning_parser
            reasoning = get_reasoning_parser(name, self.think_opened)
        return ChatReply(reasoning, self.tool_parser, self.parallel_tool_calls)


def plan_chat(state: Any, req: Any) -> ChatPlan:
    """Decide how this request's replies are produced and parsed; a bad combination is a 400 naming it."""
    tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
    choice = req.tool_choice
    if choice is None:
        choice = "auto" if tools else "none"
    parallel = req.parallel_tool_calls is not False
    grammar = None
    parser: ToolParser | None = None
    if isinstance(choice, dict):
        name = _named_function(choice)
        fn = _find_tool(tools, name)
        grammar = StructuredOutputsParams(json=fn.get("parameters") or _ANY_OBJECT, disable_any_whitespace=True)
        parser = NamedFunctionParser(name)
    elif choice == "required":
        if not tools:
            raise bad_request('tool_choice "required" needs at least one tool in `tools`.', param="tool_choice")
        grammar = StructuredOutputsParams(json=required_schema(tools, parallel), disable_any_whitespace=True)
        parser = ArrayToolParser()
    elif choice == "auto":
        if tools:
            if not (state.enable_auto_tool_choice and state.tool_call_parser):
                raise bad_request(
                    'This request sends `tools` with tool_choice "auto", which needs a tool-call parser: start the '
                    "server with --enable-auto-tool-choice "
                    "--tool-call-parser hermes|llama3_json|mistral|openai|pythonic|qwen3_coder (this model's chat template shows no "
                    'tool format wslm recognises), or send tool_choice "required" or a named function.',
                    param="tool_choice")
            parser = get_tool_parser(state.tool_call_parser, tools)
    elif choice != "none":
        raise bad_request(f'tool_choice must be "none", "auto", "required" or {{"type": "function", "function": '
                          f'{{"name": ...}}}}, got {choice!r}.', param="tool_choice")
    if grammar is not None and req.structured_source:
        raise bad_request(f"tool_choice {choice if isinstance(choice, str) else 'naming a function'} already "
                          f"constrains the reply; remove `{req.structured_source}`.", param=req.structured_source)
    if choice == "none" and getattr(state, "exclude_tools_when_tool_choice_none", False):
        tools = None  # --exclude-tools-when-tool-choice-none: the template never sees them
    tokenizer = getattr(state, "tokenizer", None)
    keep = parser is not None and any(is_special_token(tokenizer, m) for m in parser.output_markers)
    reasoning = getattr(state, "reasoning_parser", None)
    if reasoning and any(is_special_token(tokenizer, m) for m in REASONING_PARSERS[reasoning].markers):
        keep = True  # harmony's channel markers are special tokens
    return ChatPlan(tools, grammar, parser, parallel, reasoning, keep, named=isinstance(choice, dict))


def required_schema(tools: list[dict], parallel: bool) -> dict:
    """vLLM's schema for tool_choice "required": a non-empty array of calls to the given tools. Each tool's
    `$defs` / `definitions` move to the root, where its `#/$defs/...` references now point (pydantic-made tool
    schemas, as LangChain and the OpenAI SDK send them, use them)."""
    defs: dict[str, dict] = {}
    options = []
    for t in tools:
        params = dict(t["function"].get("parameters") or _ANY_OBJECT)
        for key in ("$defs", "definitions"):
            for name, sub in (params.pop(key, None) or {}).items():
                if defs.setdefault(key, {}).setdefault(name, sub) != sub:
                    raise bad_request(f"Two tools define {key}.{name} differently; with tool_choice \"required\" "
                                      "their definitions share one namespace: rename one.", param="tools")
        options.append({
            "type": "object",
            "properties": {"name": {"type": "string", "enum": [t["function"]["name"]]}, "parameters": params},
            "required": ["name", "parameters"],
        })
    schema: dict = {"type": "array", "minItems": 1, "items": {"anyOf": options} if len(options) > 1 else options[0],
                    **defs}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def _named_function(choice: dict) -> str:
    fn = choice.get("function")
    if choice.get("type") != "function" or not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise bad_request('A named tool_choice looks like {"type": "function", "function": {"name": "my_function"}}.',
                          param="tool_choice")
    return fn["name"]


def _find_tool(tools: list[dict] | None, name: str) -> dict:
    for t in tools or []:
        if t["function"]["name"] == name:
            return t["function"]
    known = ", ".join(t["function"]["name"] for t in tools or []) or "none"
    raise bad_request(f"tool_choice names the function {name!r}, which is not in `tools` (given: {known}).",
                      param="tool_choice")
