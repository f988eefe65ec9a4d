"""LLM: vLLM's offline API. `LLM(model="demo").generate(["Hello"], SamplingParams(max_tokens=32))`."""

from __future__ import annotations

import itertools

from wslm.backend.config import EngineConfig
from wslm.backend.frontend.beam_search import BeamSearch, BeamSearchOutput, BeamSearchParams
from wslm.backend.frontend.engine_factory import create_engine
from wslm.backend.lora.request import LoRARequest
from wslm.backend.outputs import PoolingRequestOutput, RequestOutput, fold_output
from wslm.backend.pooling_params import PoolingParams
from wslm.backend.sampling_params import SamplingParams

PromptType = str | list[int] | dict


class LLM:
    def __init__(self, model: str = "demo", **kwargs) -> None:
        self.llm_engine = create_engine(EngineConfig(model=model, **kwargs))
        self._ids = itertools.count()

    def get_tokenizer(self):
        return self.llm_engine.tokenizer

    def generate(
        self,
        prompts: PromptType | list[PromptType],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool = False,
        lora_request: LoRARequest | list[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """lora_request: the adapter every prompt runs with, or one per prompt (None: the base), as vLLM's;
        needs LLM(..., enable_lora=True)."""
        if isinstance(prompts, (str, dict)) or (
            isinstance(prompts, list) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]
        return self._run(list(prompts), sampling_params, lora_request)

    def chat(
        self,
        messages: list[dict] | list[list[dict]],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        use_tqdm: bool = False,
        continue_final_message: bool = False,
        tools: list[dict] | None = None,
        chat_template_kwargs: dict | None = None,
        lora_request: LoRARequest | list[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """vLLM's LLM.chat: each conversation rendered by the same function the server uses (chat.render_chat)."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        engine = self.llm_engine
        options = dict(continue_final_message=continue_final_message, tools=tools,
                       chat_template_kwargs=chat_template_kwargs)
        prompts = [
            {"prompt_token_ids": engine.apply_chat_template(conv, chat_template, add_generation_prompt, **options)}
            for conv in conversations
        ]
        return self._run(prompts, sampling_params, lora_request)

    def beam_search(self, prompts: list[PromptType], params: BeamSearchParams,
                    use_tqdm: bool = False) -> list[BeamSearchOutput]:
        """vLLM's LLM.beam_search: the beam_width best continuations of each prompt (text, token ids, or
        {"prompt": ...} / {"prompt_token_ids": ...}), best first (frontend/beam_search.py)."""
        engine = self.llm_engine
        mc = engine.model_config
        searches = []
        for prompt in prompts:  # tokenized and checked as generate() would
            probe = engine.process(f"beam-{next(self._ids)}", prompt, SamplingParams(max_tokens=1))
            searches.append(BeamSearch(probe.prompt_token_ids, params, set(mc.eos_token_ids), mc.max_model_len))
        while live := [s for s in searches if not s.done]:
            batches = [s.step_prompts() for s in live]
            outs = self._run([{"prompt_token_ids": ids} for batch in batches for ids in batch], live[0].step_params())
            k = 0
            for search, batch in zip(live, batches):
                search.advance(outs[k:k + len(batch)])
                k += len(batch)
        return [BeamSearchOutput(s.result(engine.tokenizer)) for s in searches]

    def embed(
        self,
        prompts: PromptType | list[PromptType],
        pooling_params: PoolingParams | None = None,
        use_tqdm: bool = False,
    ) -> list[PoolingRequestOutput]:
        """One embedding per prompt (text or token ids), as vLLM's LLM.embed: `.outputs.embedding`."""
        if isinstance(prompts, (str, dict)) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        engine = self.llm_engine
        if getattr(engine, "task", "generate") != "embed":
            raise ValueError("LLM.embed needs an embedding model (this one generates text); load one, or pass "
                             "task='embed'.")
        ids = [f"embed-{next(self._ids)}" for _ in prompts]
        try:
            for rid, prompt in zip(ids, prompts):
                engine.add_request(rid, prompt, pooling_params or PoolingParams())
        except ValueError:
            engine.abort_request(ids)
            raise
        return self._collect_pooling(ids)

    def score(self, text_1: str | list[str], text_2: str | list[str]) -> list[PoolingRequestOutput]:
        """A cross-encoder's relevance score per pair (text_1 against each text_2, or pairwise when both
        are lists), as vLLM's LLM.score: `.outputs.data[0]`, sigmoid(logit) in [0, 1]."""
        a = [text_1] if isinstance(text_1, str) else list(text_1)
        b = [text_2] if isinstance(text_2, str) else list(text_2)
        if len(a) != 1 and len(a) != len(b):
            raise ValueError(f"text_1 has {len(a)} texts and text_2 {len(b)}: give one text_1, or as many as text_2.")
        engine = self.llm_engine
        if getattr(engine, "task", "generate") != "score":
            raise ValueError("LLM.score needs a cross-encoder (such as bge-reranker); this model does not score pairs.")
        pairs = [(a[0], y) for y in b] if len(a) == 1 else list(zip(a, b))
        ids = [f"score-{next(self._ids)}" for _ in pairs]
        try:
            for rid, (x, y) in zip(ids, pairs):
                engine.add_request(rid, {"text": x, "text_pair": y}, PoolingParams())
        except ValueError:
            engine.abort_request(ids)
            raise
        return self._collect_pooling(ids)

    def _collect_pooling(self, ids: list[str]) -> list[PoolingRequestOutput]:
        engine = self.llm_engine
        results: dict[str, PoolingRequestOutput] = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.error:
                    engine.abort_request(ids)
                    raise RuntimeError(out.error)
                results[out.request_id] = out
        return [results[rid] for rid in ids]

    def _run(self, prompts: list, sampling_params, lora_request=None) -> list[RequestOutput]:
        if sampling_params is None:
            sampling_params = SamplingParams()
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"Got {len(prompts)} prompts but {len(params)} SamplingParams.")
        loras = lora_request if isinstance(lora_request, list) else [lora_request] * len(prompts)
        if len(loras) != len(prompts):
            raise ValueError(f"Got {len(prompts)} prompts but {len(loras)} LoRA requests.")
        engine = self.llm_engine
        ids = [f"llm-{next(self._ids)}" for _ in prompts]
        # Every request made ready (checked, grammar compiled) before any is queued: a bad one raises here.
        ready = [engine.process(rid, prompt, p, **({"lora_request": lora} if lora is not None else {}))
                 for rid, prompt, p, lora in zip(ids, prompts, params, loras)]
        for request in ready:
            engine.add_engine_request(request)
        results: dict[str, RequestOutput] = {}
        while engine.has_unfinished_requests():
            for delta in engine.step():
                fold_output(results, delta)
        return [results[rid] for rid in ids]

