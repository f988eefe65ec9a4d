"""Which tool-call and reasoning parsers a server uses: the flags when given (vLLM's), else what the chat
template shows (a `<tool_call>` template writes Hermes calls, a `<think>` one reasons), logged either way."""

from __future__ import annotations

import logging
from argparse import Namespace
from typing import Any

from wslm.backend.entrypoints.openai.reasoning import pick_reasoning_parser
from wslm.backend.entrypoints.openai.tool_parsers import pick_tool_parser

log = logging.getLogger("wslm.server")


def choose_parsers(args: Namespace, chat_template: str | None) -> dict[str, Any]:
    """ServerState's enable_auto_tool_choice, tool_call_parser and reasoning_parser."""
    tool_parser = getattr(args, "tool_call_parser", None)
    auto = bool(getattr(args, "enable_auto_tool_choice", False))
    if tool_parser:
        log.info("Tool calls: parser %s (--tool-call-parser)%s.", tool_parser,
                 "" if auto else '; tool_choice "auto" is off without --enable-auto-tool-choice')
    else:
        tool_parser = pick_tool_parser(chat_template)
        if tool_parser:
            auto = True
            log.info('Tool calls: parser %s picked from the chat template, tool_choice "auto" on '
                     "(--tool-call-parser to choose another).", tool_parser)
        elif auto:
            log.warning("--enable-auto-tool-choice without --tool-call-parser, and the chat template shows no "
                        'tool format wslm knows: tool_choice "auto" will be refused. Add --tool-call-parser '
                        "hermes|llama3_json|mistral|openai|pythonic|qwen3_coder.")
        else:
            log.info('Tool calls: the chat template shows no tool format; tool_choice "required" and named '
                     'functions work, "auto" needs --enable-auto-tool-choice --tool-call-parser NAME.')
    reasoning = getattr(args, "reasoning_parser", None)
    if reasoning:
        log.info("Reasoning: parser %s (--reasoning-parser).", reasoning)
    else:
        reasoning = pick_reasoning_parser(chat_template)
        if reasoning:
            log.info("Reasoning: parser %s picked from the chat template (the reasoning goes to reasoning_content; "
                     "--reasoning-parser to choose another).", reasoning)
    return {"enable_auto_tool_choice": auto, "tool_call_parser": tool_parser, "reasoning_parser": reasoning,
            "exclude_tools_when_tool_choice_none": bool(getattr(args, "exclude_tools_when_tool_choice_none", False))}
