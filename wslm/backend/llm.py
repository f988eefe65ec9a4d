"""LLM: vLLM's offline API. `LLM(model="demo").generate(["Hello"], SamplingParams(max_tokens=32))`."""

from __future__ import annotations

import itertools

from wslm.backend.config import EngineConfig
from wslm.backend.llm_engine import LLMEngine
from wslm.backend.outputs import RequestOutput, fold_output
from wslm.backend.sampling_params import SamplingParams

PromptType = str | list[int] | dict


class LLM:
    def __init__(self, model: str = "demo", **kwargs) -> None:
        self.llm_engine = LLMEngine(EngineConfig(model=model, **kwargs))
        self._ids = itertools.count()

    def get_tokenizer(self):
        return self.llm_engine.tokenizer

    def generate(
        self,
        prompts: PromptType | list[PromptType],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        if isinstance(prompts, (str, dict)) or (
            isinstance(prompts, list) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]
        return self._run(list(prompts), sampling_params)

    def chat(
        self,
        messages: list[dict] | list[list[dict]],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        engine = self.llm_engine
        prompts = [
            {"prompt_token_ids": engine.apply_chat_template(conv, chat_template, add_generation_prompt)}
            for conv in conversations
        ]
        return self._run(prompts, sampling_params)

    def _run(self, prompts: list, sampling_params) -> list[RequestOutput]:
        if sampling_params is None:
            sampling_params = SamplingParams()
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"Got {len(prompts)} prompts but {len(params)} SamplingParams.")
        engine = self.llm_engine
        ids = [f"llm-{next(self._ids)}" for _ in prompts]
        for p in params:  # grammars compile before any request is queued (cached; a bad one raises here)
            if p.structured_outputs is not None:
                engine.structured.compile(p.structured_outputs)
        try:
            for rid, prompt, p in zip(ids, prompts, params):
                engine.add_request(rid, prompt, p.clone())
        except ValueError:
            engine.abort_request(ids)
            engine.step()  # drain the abort outputs
            raise
        results: dict[str, RequestOutput] = {}
        while engine.has_unfinished_requests():
            for delta in engine.step():
                fold_output(results, delta)
        return [results[rid] for rid in ids]

