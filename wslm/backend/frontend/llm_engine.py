"""LLMEngine: add_request / abort_request / step(), vLLM's offline engine API. Not thread-safe: one thread
owns it (the server's engine loop, or LLM.generate).

It is the front end of the engine core: the InputProcessor makes each request ready once (render, tokenize,
truncate, validate, grammar), the EngineCore (engine/core.py) schedules and runs token ids, and the
OutputProcessor turns the core's new token ids into text deltas and checks stop strings (they need the
text); the core decided every token-level stop (engine/stop_check.py)."""

from __future__ import annotations

import logging
import time
from typing import Any

from wslm import envs, kernels
from wslm.backend.config import EngineConfig
from wslm.backend.engine.core import EngineCore, EngineRequest
from wslm.backend.engine.core_client import EngineCoreClient, InprocClient, MPClient
from wslm.backend.engine.core_setup import build_core
from wslm.backend.executor.abstract import kv_cache_note
from wslm.backend.frontend import tokenizer_aside
from wslm.backend.frontend.input_processor import InputProcessor
from wslm.backend.frontend.output_processor import OutputProcessor
from wslm.backend.frontend.validation import RequestLimits
from wslm.backend.frontend.vision_prompts import vision_for
from wslm.backend.loader.model_loader import load_model_config, load_tokenizer, resolve_model
from wslm.backend.loader.model_source import with_mmproj
from wslm.backend.outputs import RequestOutput
from wslm.backend.platforms import pick_device
from wslm.backend.platforms.cpu.tuning import tune_allocator
from wslm.backend.platforms.kv_cache import kv_cache_torch_dtype
from wslm.backend.pooling_params import PoolingParams
from wslm.backend.sampling_params import SamplingParams
from wslm.backend.sequence import RequestState
from wslm.backend.structured.compiler import StructuredOutputCompiler
from wslm.kernels import cpu_gemv

logger = logging.getLogger("wslm.engine")


class LLMEngine:
    def __init__(self, config: EngineConfig, core_process: bool = False) -> None:
        """core_process: run the engine core in a child process (engine/core_client.py MPClient), as the
        server does; else in this process and thread (LLM, tests)."""
        start = time.monotonic()
        self.config = config
        self.device = pick_device(config.device)
        if self.device.type == "cpu":
            tune_allocator()
        source = with_mmproj(resolve_model(config.model, config.revision, config.download_dir), config.mmproj)
        if self.task_is_embed(config):
            source.mmproj = None  # an embedding model takes no images
        self.source = source
        self.model_name = source.name
        self.task = "embed" if self.task_is_embed(config) else "generate"
        # The server's tokenizers are built aside once it serves (frontend/tokenizer_aside.py: the GIL).
        build = tokenizer_aside.load_tokenizer if core_process else load_tokenizer
        self.tokenizer = build(source, config.tokenizer, config.trust_remote_code)
        hf_config, mc = load_model_config(
            source, self.tokenizer, config.dtype, self.device, config.trust_remote_code, config.quantization
        )
        mc.kv_cache_dtype = kv_cache_torch_dtype(config.kv_cache_dtype, self.device)
        self.model_config = mc
        self.pooling = None  # DecoderPooling when this engine serves an embedding model (--task embed)
        if self.task == "embed":
            from wslm.backend.pooling.decoder import DecoderPooling

            self.pooling = DecoderPooling(source, mc, config)
        logger.info(
            "Loading %s (%s, %s, weights %s) on %s",
            source.name, mc.architecture, mc.dtype, mc.quantization or "dense", self.device,
        )
        logger.info("Kernels: %s", kernels.backend_description(self.device))
        if self.device.type == "cpu" and (why := cpu_gemv.why_unavailable()):  # else ~2x slower, silently
            logger.warning("Fast CPU path off: %s; torch's slower kernels run instead", why)
        spec = config.speculative()
        if spec is not None and self.pooling is None:
            logger.info("Speculative decoding: %s", spec.describe())
            if spec.method == "draft_model":
                from wslm.backend.spec_decode.draft import check_draft_tokenizer

                check_draft_tokenizer(self.tokenizer, spec.model, config.trust_remote_code)
            if spec.method == "draft_model" and mc.uniform_sliding_window:
                raise ValueError("speculative_config: a draft model cannot run beside a sliding-window model yet; "
                                 'use "method": "ngram".')
        self.core: EngineCore | None = None  # in-process only (LLM, tests, embeddings, WSLM_CORE_PROCESS=0)
        self.executor = None
        if core_process and self.pooling is None:
            self.client: EngineCoreClient = MPClient(config, source, mc, self.device, tokenizer=self.tokenizer,
                                                     start_method=envs.WSLM_CORE_START_METHOD, name=source.name)
            info = self.client.info
            mc.max_model_len = info.max_model_len
        else:
            model_max = mc.max_position_embeddings
            if self.pooling is not None and self.pooling.pooler.max_seq_length:
                # sentence_bert_config.json's max_seq_length, as for encoders (encoder_engine.py) and vLLM
                model_max = min(model_max, self.pooling.pooler.max_seq_length)
            self.core, info = build_core(config, source, mc, self.device, embedding=self.pooling is not None,
                                         model_max=model_max)
            self.executor = self.core.executor
            self.client = InprocClient(self.core)
        num_blocks, held = info.num_blocks, info.window_blocks
        self.max_model_len = mc.max_model_len
        # What one request may ask for; the server swaps in its own stop-list limits (its flags).
        limits = RequestLimits(mc.max_model_len, mc.vocab_size, config.max_num_seqs, num_blocks, config.block_size,
                               max_logprobs=config.max_logprobs, window_blocks=held)
        # Structured output: thread-safe, so the server compiles grammars in worker threads ahead of add_request.
        structured = None if self.pooling else StructuredOutputCompiler(self.tokenizer, mc.vocab_size,
                                                                         sorted(mc.eos_token_ids))
        self.processor = InputProcessor(self.tokenizer, limits, structured, config.chat_template, self.model_name)
        self.processor.vision = vision_for(source, hf_config, mc.architecture, config, self.tokenizer, mc)  # None: text only
        from wslm.backend.lora.checks import AdapterChecker

        self.processor.lora_checker = AdapterChecker(config.enable_lora and not self.pooling, config.max_lora_rank, mc)
        self.output_processor = OutputProcessor(self.tokenizer, mc.max_model_len)
        self._pending: list = []  # outputs made outside step() (aborts)
        kv_gib = info.kv_cache_bytes / 2**30
        logger.info(
            "KV cache: %d blocks of %d tokens = %d tokens (%.2f GiB%s); max_model_len %d; "
            "max concurrent full-length sequences %.1f; prefix caching %s; ready in %.1fs",
            num_blocks, config.block_size, num_blocks * config.block_size, kv_gib,
            kv_cache_note(config.tensor_parallel_size, num_blocks, mc.num_kv_heads),
            mc.max_model_len,
            num_blocks * config.block_size / mc.max_model_len, "on" if config.enable_prefix_caching else "off",
            time.monotonic() - start,
        )  # fmt: skip

    @staticmethod
    def task_is_embed(config: EngineConfig) -> bool:
        return config.task in ("embed", "embedding", "pooling")

    # ---- what the server and LLM read ----------------------------------------------------------
    @property
    def limits(self) -> RequestLimits:
        return self.processor.limits

    @limits.setter
    def limits(self, value: RequestLimits) -> None:
        self.processor.limits = value

    @property
    def chat_template(self) -> str | None:
        """The --chat-template override's text, or None (the tokenizer's own template)."""
        return self.processor.chat_template

    @property
    def structured(self) -> StructuredOutputCompiler | None:
        return self.processor.structured

    @property
    def scheduler(self):
        return self.core.scheduler

    @property
    def block_manager(self):
        return self.core.block_manager

    @property
    def requests(self) -> dict[str, RequestState]:
        return self.core.requests

    # ---- requests ------------------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt: str | list[int] | dict,
        params: SamplingParams | PoolingParams | None = None,
        arrival_time: float | None = None,
    ) -> None:
        """Queue a request. Raises ValueError (nothing queued) when the request cannot be served."""
        self.add_engine_request(self.process(request_id, prompt, params, arrival_time))

    def process(self, request_id: str, prompt: str | list[int] | dict,
                params: SamplingParams | PoolingParams | None = None, arrival_time: float | None = None,
                **names: Any) -> EngineRequest:
        """The request made ready for the core (input_processor.py); thread-safe. names: what=, the request
        field the prompt came from, and structured_param=, the one the grammar came from (errors name them)."""
        if self.pooling is not None or isinstance(params, PoolingParams):
            if self.pooling is None or not isinstance(params, PoolingParams):
                raise ValueError("This engine serves " + ("an embedding model: it takes embedding requests, "
                                 "not text generation." if self.pooling else "text generation, not embeddings."))
            return self.pooling.process(self.processor, request_id, prompt, params, arrival_time)
        req = self.processor.process(request_id, prompt, params, arrival_time, **names)
        if req.grammar is not None and self.core is None:
            req.grammar.to_json()  # its pickled form, made here in the caller's worker thread, not the engine's
        return req

    def add_engine_request(self, req: EngineRequest) -> None:
        """Queue a request process() made (in any thread); only the owning thread calls this."""
        if isinstance(req.params, PoolingParams):
            self.core.add_request(req)
            return
        if req.request_id in self.output_processor.requests:
            raise ValueError(f"Request id {req.request_id!r} is already in use.")
        self.client.add_request(req)
        self.output_processor.add(req.request_id, req.prompt, req.prompt_token_ids, req.params,
                                      req.arrival_time)

    def abort_request(self, request_id: str | list[str]) -> None:
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        now = time.monotonic()
        for rid in ids:
            if self.pooling is not None:
                out = self.pooling.abort(self.core, rid)
                if out is not None:
                    self._pending.append(out)
                continue
            if rid in self.output_processor.requests:
                self.client.abort(rid)
            ro = self.output_processor.abort(rid, now)
            if ro is not None:
                self._pending.append(ro)

    def has_unfinished_requests(self) -> bool:
        if self.pooling is not None:
            return self.core.has_unfinished_requests() or bool(self._pending)
        # A core process may still hold an aborted request until it says it is idle: keep collecting.
        return self.output_processor.has_unfinished() or bool(self._pending) or bool(
            getattr(self.client, "busy", False))

    # ---- the step ------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        outputs, self._pending = self._pending, []
        if self.pooling is not None:
            return outputs + self.pooling.step(self.core)
        result = self.client.get_output()
        now = time.monotonic()
        made, stopped = self.output_processor.process(result.tokens, now)
        for rid, index in stopped:  # a stop string ended it: the core frees its blocks
            self.client.abort(rid, index)
        outputs.extend(made)
        for failure in result.failed:
            ro = self.output_processor.fail(failure.request_id, failure.kind, failure.message, now)
            if ro is not None:
                outputs.append(ro)
        return outputs

    def shutdown(self) -> None:
        """Stop the core process or the tensor-parallel workers, if any (idempotent; also runs at exit)."""
        self.client.shutdown()

    def restart_core(self, config: EngineConfig | None = None) -> None:
        """After the core process died (its requests were failed): forget them and start a new core with the
        same model, tokenizer and context length (config: the engine flags, e.g. a GPU share measured anew).
        Raises the load's error, as at start; the engine stays without a core then."""
        from wslm.backend.frontend.core_restart import start_new_core

        self.forget_requests()
        self.client = start_new_core(self, config or self.config)

    def forget_requests(self) -> None:
        """Drop every request's state (its core is gone; the caller told each one why)."""
        self.output_processor.requests.clear()
        self._pending.clear()

    def start_background_compile(self) -> None:
        """Start the compile that would otherwise wait for the first batch (the CPU decode step): the server
        calls it once ready, so that its first concurrent requests find the compile under way or done."""
        self.client.start_background_compile()

    def check_health(self) -> None:
        """Raises EngineDeadError when the model's core process or workers are gone."""
        self.client.check_health()

    # ---- chat and stats ------------------------------------------------------------------------
    def apply_chat_template(
        self, messages: list[dict], chat_template: str | None = None, add_generation_prompt: bool = True,
        **options: Any,
    ) -> list[int]:
        """The prompt ids for a chat (the one path LLM.chat and the server share); options:
        continue_final_message, tools, chat_template_kwargs."""
        return self.processor.render_chat(messages, chat_template, add_generation_prompt, **options)

    def get_stats(self) -> dict:
        return self.client.get_stats()
