"""Grammar compilation (xgrammar) with a cache keyed by the constraint, and GrammarState, one request's
position in its grammar.

Why xgrammar and not llguidance: measured on the demo model's 49,152-token vocabulary on this CPU
(bench/structured.py, docs/benchmarks.md), xgrammar fills one request's next-token mask in ~12 us on
average against llguidance's ~100 us (2 ms worst case), and its CPU kernel applies 16 masks to a batch of
32 rows in ~50 us; it is also vLLM's default backend, so schemas behave as vLLM users expect. Its
compilation (~20 ms for a small schema) is paid once per schema and cached here."""

from __future__ import annotations

import json
import logging
import re
import threading
from collections import OrderedDict
from typing import Any

from wslm.backend.errors import RequestError
from wslm.backend.structured.params import MAX_WHITESPACE, StructuredOutputsParams

logger = logging.getLogger("wslm.structured")

_CACHE_SIZE = 256
# xgrammar's messages start with "[hh:mm:ss] /project/cpp/file.cc:123: "; users need only the rest.
_NATIVE_PREFIX = re.compile(r"^\[[\d:]+\] \S+?:\d+: (Check failed: \(.*?\) is false: )?")
# A counted repetition such as a{100000} makes xgrammar compile for minutes (a request could tie up a thread
# and a core): counts above this are refused with a 400.
MAX_REPETITION = 1000
_REPEAT = re.compile(r"\{(\d+)(?:,(\d*))?\}")


class GrammarError(RequestError):
    """An invalid schema, regex, choice list or grammar: a 400 naming the problem."""


class CompiledGrammar:
    """A compiled constraint, shareable by any number of requests (each gets its own GrammarState).
    Pickles as xgrammar's JSON form (the compiled object itself does not pickle), so that a request carries
    it to an engine core process (engine/core_proc.py), which rebuilds it with set_rebuild_tokenizer's info."""

    __slots__ = ("xgr", "spec", "_json")

    def __init__(self, compiled: Any, spec: StructuredOutputsParams) -> None:
        self.xgr = compiled
        self.spec = spec
        self._json: str | None = None

    def to_json(self) -> str:
        """xgrammar's JSON form (~0.4 s and MBs for a JSON schema: made once per grammar, off the engine thread)."""
        if self._json is None:
            self._json = self.xgr.serialize_json()
        return self._json

    def __reduce__(self):
        return _rebuild_grammar, (self.to_json(), self.spec)


# In an engine core process: how pickled grammars are rebuilt (the tokenizer info is built on first use).
_rebuild_lock = threading.Lock()
_rebuild_state: dict[str, Any] = {"make_info": None, "info": None}
_rebuilt: OrderedDict[int, Any] = OrderedDict()


def set_rebuild_tokenizer(tokenizer: Any, vocab_size: int, stop_token_ids: list[int] | None = None) -> None:
    """The tokenizer whose grammars this process receives pickled (the engine core process calls it)."""
    def make_info() -> Any:
        import xgrammar as xgr

        return xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                  stop_token_ids=sorted(stop_token_ids or []) or None)

    with _rebuild_lock:
        _rebuild_state.update(make_info=make_info, info=None)
        _rebuilt.clear()


def _rebuild_grammar(data: str, spec: StructuredOutputsParams) -> CompiledGrammar:
    import xgrammar as xgr

    key = hash(data)
    with _rebuild_lock:
        hit = _rebuilt.get(key)
        if hit is None:
            if _rebuild_state["info"] is None:
                if _rebuild_state["make_info"] is None:
                    raise RuntimeError("a compiled grammar arrived before set_rebuild_tokenizer() was called")
                _rebuild_state["info"] = _rebuild_state["make_info"]()
            hit = _rebuilt[key] = xgr.CompiledGrammar.deserialize_json(data, _rebuild_state["info"])
            while len(_rebuilt) > 32:  # a few MB each
                _rebuilt.popitem(last=False)
        else:
            _rebuilt.move_to_end(key)
    grammar = CompiledGrammar(hit, spec)
    grammar._json = data
    return grammar


class GrammarState:
    """Where one sequence is in its grammar. The engine advances it with every token the sequence
    accepts; `sync` replays the output if the two ever disagree (e.g. after a state was lost)."""

    __slots__ = ("compiled", "matcher", "num_accepted")

    def __init__(self, compiled: CompiledGrammar) -> None:
        import xgrammar as xgr

        self.compiled = compiled
        self.matcher = xgr.GrammarMatcher(compiled.xgr)
        self.num_accepted = 0

    def accept(self, token: int) -> bool:
        """Advance by one generated token; True when the grammar is finished (the sequence must stop)."""
        self.num_accepted += 1
        if not self.matcher.accept_token(token):
            # Only possible if a token got past the mask (a bug): stop rather than emit invalid output.
            logger.warning("token %d does not fit the grammar; stopping the sequence", token)
            return True
        return self.matcher.is_terminated()

    def is_terminated(self) -> bool:
        return self.matcher.is_terminated()

    def sync(self, output_token_ids: list[int]) -> None:
        """Make the state match exactly these generated tokens."""
        if self.num_accepted == len(output_token_ids):
            return
        self.matcher.reset()
        self.num_accepted = 0
        for t in output_token_ids:
            self.accept(t)

    def fill_mask(self, bitmask: Any, row: int) -> None:
        self.matcher.fill_next_token_bitmask(bitmask, row)

    def fork(self) -> GrammarState:
        """A copy at the same position (for a completion that continues from this one)."""
        twin = GrammarState.__new__(GrammarState)
        twin.compiled, twin.matcher, twin.num_accepted = self.compiled, self.matcher.fork(), self.num_accepted
        return twin


class StructuredOutputCompiler:
    """Compiles constraints for one tokenizer/vocabulary. Thread-safe: the server compiles in worker
    threads (off the event loop and the engine thread); the engine then finds the result in the cache."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int] | None = None) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = sorted(stop_token_ids or [])
        self._compiler: Any = None
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple, CompiledGrammar] = OrderedDict()

    def _xgr_compiler(self) -> Any:
        with self._lock:
            if self._compiler is None:  # building the tokenizer info takes ~0.5 s: only when first needed
                import xgrammar as xgr

                info = xgr.TokenizerInfo.from_huggingface(
                    self.tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.stop_token_ids or None
                )
                self._compiler = xgr.GrammarCompiler(info, max_threads=2)
            return self._compiler

    # ---- the public entry points --------------------------------------------------------------
    def compile(self, spec: StructuredOutputsParams) -> CompiledGrammar:
        """The compiled grammar for spec (cached); GrammarError when it is invalid."""
        try:
            key = spec.cache_key()
        except RecursionError:
            raise GrammarError("The JSON schema is nested too deeply.", param=spec.kind) from None
        _check_repetitions(spec, key)
        if spec.whitespace_pattern is not None:  # said plainly rather than ignored
            raise GrammarError("whitespace_pattern (guided_whitespace_pattern) is not supported by xgrammar, wslm's "
                               "grammar engine; use disable_any_whitespace for compact JSON.",
                               param="whitespace_pattern")
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        compiled = CompiledGrammar(self._compile(spec), spec)
        with self._lock:
            self._cache[key] = compiled
            while len(self._cache) > _CACHE_SIZE:
                self._cache.popitem(last=False)
        return compiled

    def compile_json_schema(self, schema: dict | str, any_whitespace: bool = True) -> CompiledGrammar:
        return self.compile(StructuredOutputsParams(json=schema, disable_any_whitespace=not any_whitespace))

    def compile_regex(self, regex: str) -> CompiledGrammar:
        return self.compile(StructuredOutputsParams(regex=regex))

    def compile_choice(self, choices: list[str]) -> CompiledGrammar:
        return self.compile(StructuredOutputsParams(choice=choices))

    def compile_grammar(self, ebnf: str) -> CompiledGrammar:
        return self.compile(StructuredOutputsParams(grammar=ebnf))

    def compile_json_object(self) -> CompiledGrammar:
        return self.compile(StructuredOutputsParams(json_object=True))

    def new_state(self, compiled: CompiledGrammar) -> GrammarState:
        return GrammarState(compiled)

    # ---- xgrammar -----------------------------------------------------------------------------
    def _compile(self, spec: StructuredOutputsParams) -> Any:
        compiler = self._xgr_compiler()
        kind = spec.kind
        ws = {"any_whitespace": not spec.disable_any_whitespace, "max_whitespace_cnt": MAX_WHITESPACE}
        try:
            if kind == "json":
                schema = spec.json if isinstance(spec.json, str) else json.dumps(spec.json)
                return compiler.compile_json_schema(schema, strict_mode=True, **ws)
            if kind == "json_object":
                return compiler.compile_json_schema('{"type": "object"}', strict_mode=False, **ws)
            if kind == "regex":
                return compiler.compile_regex(spec.regex)
            if kind == "choice":
                alternatives = " | ".join(json.dumps(c, ensure_ascii=False) for c in spec.choice)
                return compiler.compile_grammar(f"root ::= {alternatives}")
            if kind == "grammar":
                return compiler.compile_grammar(spec.grammar)
            return compiler.compile_structural_tag(spec.structural_tag)
        except RecursionError:
            raise GrammarError(f"The {_WHAT[kind]} is nested too deeply.", param=kind) from None
        except Exception as exc:  # noqa: BLE001 - xgrammar raises RuntimeError/ValueError for bad input
            raise GrammarError(f"Invalid {_WHAT[kind]}: {_clean(exc)}", param=kind) from None


_WHAT = {
    "json": "JSON schema",
    "json_object": "JSON object grammar",
    "regex": "regular expression",
    "choice": "choice list",
    "grammar": "EBNF grammar",
    "structural_tag": "structural tag",
}


def _check_repetitions(spec: StructuredOutputsParams, key: tuple) -> None:
    text = key[1] if isinstance(key[1], str) else ""
    for m in _REPEAT.finditer(text):
        count = max(int(m.group(1)), int(m.group(2) or 0))
        if count > MAX_REPETITION:
            raise GrammarError(
                f"Invalid {_WHAT[spec.kind]}: the repetition {m.group(0)} is above wslm's limit of "
                f"{MAX_REPETITION}; use a smaller count (or + / *).",
                param=spec.kind,
            )


def _clean(exc: Exception) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return _NATIVE_PREFIX.sub("", text)
