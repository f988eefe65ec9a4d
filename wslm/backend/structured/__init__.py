"""Structured output: a request's tokens forced to match a JSON schema, regex, choice list or EBNF grammar.

The engine (xgrammar underneath; see compiler.py for why) masks the logits of each constrained request in
the batched sampler and advances the request's grammar state with every token it accepts; when the grammar
is complete the request finishes with finish_reason "stop".

Using it (what the server, LLM.generate and the tool-calling code do):

    from wslm.backend.structured import StructuredOutputsParams
    params = SamplingParams(max_tokens=200, structured_outputs=StructuredOutputsParams(json=schema))
    # or regex=..., choice=[...], grammar="root ::= ...", json_object=True

The engine's input processor (frontend/input_processor.py) compiles a request's grammar once, in the thread
that processes the request: the server's worker thread (so the ~10-100 ms compile stays off the event loop
and the engine thread), or LLM's caller. Compiled grammars are cached by value. A bad schema, regex or
grammar raises GrammarError (a RequestError with .param) naming the problem.

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
