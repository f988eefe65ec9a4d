"""Structured output: a request's tokens forced to match a JSON schema, regex, choice list or EBNF grammar.

The engine (xgrammar underneath; see compiler.py for why) masks the logits of each constrained request in
the batched sampler and advances the request's grammar state with every token it accepts; when the grammar
is complete the request finishes with finish_reason "stop".

Using it (what the server, LLM.generate and the tool-calling code do):

    from wslm.backend.structured import StructuredOutputsParams
    params = SamplingParams(max_tokens=200, structured_outputs=StructuredOutputsParams(json=schema))
    # or regex=..., choice=[...], grammar="root ::= ...", json_object=True

    engine.structured.compile(params.structured_outputs)   # optional: compile ahead (cached by value);
    # raises GrammarError (a ValueError with .param) naming the problem for a bad schema/regex/grammar.

Ahead-of-time compilation keeps the ~10-100 ms compile off the engine thread: the server calls
`await async_engine.compile_structured(spec)` (runs in a worker thread) before it submits; LLM.generate
compiles before add_request. add_request then finds the grammar in the cache.

- StructuredOutputsParams (params.py): vLLM's class; GuidedDecodingParams is its older alias.
- StructuredOutputCompiler (compiler.py): compile(spec), compile_json_schema(schema), compile_regex,
  compile_choice, compile_grammar (EBNF), compile_json_object -> CompiledGrammar; new_state -> GrammarState.
- GrammarMasker (mask.py): used by the sampler."""

from wslm.backend.structured.params import GuidedDecodingParams, StructuredOutputsParams

_LAZY = ("CompiledGrammar", "GrammarError", "GrammarState", "StructuredOutputCompiler")


def __getattr__(name: str):
    # compiler.py imports validation.py, which imports sampling_params.py, which imports params.py from
    # here: loading the compiler lazily keeps that chain free of cycles.
    if name in _LAZY:
        from wslm.backend.structured import compiler

        return getattr(compiler, name)
    raise AttributeError(name)


__all__ = [*_LAZY, "GuidedDecodingParams", "StructuredOutputsParams"]
