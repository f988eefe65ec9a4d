"""Speculative decoding, vLLM's way: proposals (n-gram prompt lookup or a draft model) verified by the target
model in one batched forward on the paged KV cache, with rejection sampling above temperature 0.

config.py parses --speculative-config; ngram.py and draft.py propose; engine_hook.py is the core's side
(proposals before scheduling, grammar rows, accepted counts, block trimming); verify.py and rejection.py are
the worker's (scoring K+1 positions per sequence and choosing the tokens)."""
