"""`wslm generate` and `wslm chat`: the engine straight from a terminal, streaming, no server."""

from __future__ import annotations

import argparse
import json
import sys


def _add_engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="demo", help="demo (default), a model folder, a .gguf file or a repo id")
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--seed", type=int, default=None)


def register(sub) -> None:
    gen = sub.add_parser("generate", help="complete one prompt with the engine (no server)")
    gen.add_argument("prompt", help="the prompt text, or - to read it from stdin")
    gen.add_argument("--json", action="store_true", help="print one JSON line with text, tokens and timing")
    _add_engine_args(gen)
    gen.set_defaults(func=_generate)
    chat = sub.add_parser("chat", help="chat with a model in the terminal (no server)")
    chat.add_argument("--system", default=None, help="a system prompt")
    _add_engine_args(chat)
    chat.set_defaults(func=_chat)


def _engine(args):
    from wslm.backend.config import EngineConfig
    from wslm.backend.frontend.llm_engine import LLMEngine

    return LLMEngine(EngineConfig(model=args.model, max_model_len=args.max_model_len, device=args.device,
                                  dtype=args.dtype))  # fmt: skip


def _params(args):
    from wslm.backend import SamplingParams

    return SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                          seed=args.seed)  # fmt: skip


def _stream(engine, request_id: str, prompt, params, out=sys.stdout) -> tuple[str, object]:
    """Run one request to the end, printing text as it arrives. Returns (text, the whole output)."""
    from wslm.backend.outputs import fold_output

    engine.add_request(request_id, prompt, params)
    results: dict = {}
    try:
        while engine.has_unfinished_requests():
            for o in engine.step():
                fold_output(results, o)
                for c in o.outputs:
                    if out is not None:
                        out.write(c.text)
                        out.flush()
    except KeyboardInterrupt:
        engine.abort_request(request_id)
        for o in engine.step():
            fold_output(results, o)
    total = results.get(request_id)
    return ("".join(c.text for c in total.outputs) if total else ""), total


def _generate(args) -> int:
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    try:
        engine = _engine(args)
        text, last = _stream(engine, "generate", prompt, _params(args), None if args.json else sys.stdout)
    except (ValueError, FileNotFoundError) as exc:
        print(f"wslm generate: {exc}", file=sys.stderr)
        return 1
    if args.json:
        m = last.metrics
        print(json.dumps({
            "text": text,
            "finish_reason": last.outputs[-1].finish_reason if last.outputs else None,
            "prompt_tokens": len(last.prompt_token_ids),
            "ttft_s": (m.first_token_time - m.arrival_time) if m and m.first_token_time else None,
        }, ensure_ascii=False))  # fmt: skip
    else:
        print()
    return 0


def _chat(args) -> int:
    try:
        engine = _engine(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"wslm chat: {exc}", file=sys.stderr)
        return 1
    messages = [{"role": "system", "content": args.system}] if args.system else []
    print("Type a message; an empty line or Ctrl-D quits.", file=sys.stderr)
    turn = 0
    while True:
        try:
            line = input("> ")
        except EOFError:
            break
        if not line.strip():
            break
        messages.append({"role": "user", "content": line})
        try:
            ids = engine.apply_chat_template(messages)
            reply, _ = _stream(engine, f"chat-{turn}", {"prompt_token_ids": ids}, _params(args))
        except ValueError as exc:  # e.g. the conversation outgrew the context
            print(f"\n[{exc}]", file=sys.stderr)
            messages.pop()
            continue
        print()
        messages.append({"role": "assistant", "content": reply})
        turn += 1
    return 0
