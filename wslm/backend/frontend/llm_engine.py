"""LLMEngine: add_request / abort_request / step(). Not thread-safe: one thread owns it (the server's
engine loop, or LLM.generate)."""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from wslm import kernels
from wslm.backend.config import EngineConfig
from wslm.backend.engine.block_manager import BlockManager, window_blocks
from wslm.backend.engine.scheduler import Scheduler
from wslm.backend.errors import EngineDeadError
from wslm.backend.executor.abstract import kv_cache_note
from wslm.backend.fault_injection import Faults
from wslm.backend.frontend.chat import read_template, render_chat
from wslm.backend.frontend.output_processor import OutputProcessor
from wslm.backend.frontend.validation import RequestLimits, validate_prompt
from wslm.backend.loader.model_loader import load_model_config, load_tokenizer, resolve_model
from wslm.backend.outputs import OUT_OF_MEMORY_ERROR, CompletionOutput, RequestMetrics, RequestOutput
from wslm.backend.platforms import pick_device
from wslm.backend.platforms.cpu.tuning import tune_allocator
from wslm.backend.platforms.kv_cache import determine_num_blocks, kv_cache_torch_dtype
from wslm.backend.pooling_params import PoolingParams
from wslm.backend.sampling_params import SamplingParams
from wslm.backend.sequence import RequestState, Sequence
from wslm.backend.structured.compiler import GrammarState, StructuredOutputCompiler
from wslm.backend.worker.model_runner import ModelRunner, load_model
from wslm.backend.worker.prompt_logprobs import prompt_logprob_positions, record_prompt_logprobs
from wslm.backend.worker.sampler import Sampler
from wslm.backend.worker.token_rules import TokenRules

logger = logging.getLogger("wslm.engine")


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        start = time.monotonic()
        self.config = config
        self.faults = Faults.from_env()  # tests only (fault_injection.py)
        if self.faults is not None:
            self.faults.before_load()
        self.device = pick_device(config.device)
        if self.device.type == "cpu":
            tune_allocator()
        source = resolve_model(config.model, config.revision, config.download_dir)
        self.model_name = source.name
        self.task = "embed" if config.task in ("embed", "embedding", "pooling") else "generate"
        self.tokenizer = load_tokenizer(source, config.tokenizer, config.trust_remote_code)
        _, mc = load_model_config(
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
        if config.tensor_parallel_size > 1:
            from wslm.backend.distributed.parallel_state import check_divisible
            from wslm.backend.executor import make_executor
            from wslm.backend.quant.shard import checkpoint_group_size

            check_divisible(mc, config.tensor_parallel_size, checkpoint_group_size(source, mc.quantization))
            self.runner = make_executor(config, source, mc)
            num_blocks = self.runner.num_blocks
        else:
            model = load_model(source, mc, self.device, embedding=self.pooling is not None)
            num_blocks = determine_num_blocks(config, mc, self.device)
        # Every layer windowed: the block manager frees blocks behind the window, so one sequence holds at most
        # `held` blocks and, when the pool has that many, the context is the model's own, not what the pool holds.
        window = mc.uniform_sliding_window
        held = window_blocks(window, config.block_size, config.max_num_batched_tokens) if window else None
        capacity = num_blocks * config.block_size
        if held is not None and num_blocks >= held:
            capacity = max(capacity, mc.max_position_embeddings)
        mc.max_model_len = self._resolve_max_model_len(capacity)
        self.max_model_len = mc.max_model_len
        self.block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching, window)
        self.scheduler = Scheduler(config, self.block_manager)
        # What one request may ask for; the server swaps in its own stop-list limits (its flags).
        self.limits = RequestLimits(mc.max_model_len, mc.vocab_size, config.max_num_seqs, num_blocks, config.block_size,
                                    max_logprobs=config.max_logprobs, window_blocks=held)
        if config.tensor_parallel_size == 1:
            self.runner = ModelRunner(model, config.block_size, num_blocks)
        # CUDA graphs serve decode steps, which an embedding model never runs.
        decodes = self.pooling is None
        if self.device.type == "cuda" and not config.enforce_eager and config.tensor_parallel_size == 1 and decodes:
            self.runner.enable_cuda_graphs(config.max_num_seqs, mc.max_model_len)
        if self.device.type == "cpu" and config.tensor_parallel_size == 1 and decodes:
            self.runner.enable_cpu_compile(config.enforce_eager)
        self.sampler = Sampler(mc.vocab_size, self.device, config.seed)
        # Structured output: thread-safe, so the server compiles grammars in worker threads ahead of add_request.
        self.structured = StructuredOutputCompiler(self.tokenizer, mc.vocab_size, sorted(mc.eos_token_ids))
        self.output_processor = OutputProcessor(self.tokenizer, mc.max_model_len)
        self.chat_template = read_template(config.chat_template)
        self.requests: dict[str, RequestState] = {}
        self._pending: list[RequestOutput] = []  # outputs made outside step() (aborts)
        self._next_seq_id = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        kv_gib = self.runner.kv_cache_bytes / 2**30
        logger.info(
            "KV cache: %d blocks of %d tokens = %d tokens (%.2f GiB%s); max_model_len %d; "
            "max concurrent full-length sequences %.1f; prefix caching %s; ready in %.1fs",
            num_blocks, config.block_size, num_blocks * config.block_size, kv_gib,
            kv_cache_note(config.tensor_parallel_size, num_blocks, mc.num_kv_heads),
            mc.max_model_len,
            num_blocks * config.block_size / mc.max_model_len, "on" if config.enable_prefix_caching else "off",
            time.monotonic() - start,
        )  # fmt: skip

    def _resolve_max_model_len(self, capacity: int) -> int:
        model_max = self.model_config.max_position_embeddings
        asked = self.config.max_model_len
        if asked is None:
            if capacity < model_max:
                logger.info("max_model_len capped at %d tokens: all the KV cache holds", capacity)
            return min(model_max, capacity)
        if asked > model_max:
            raise ValueError(
                f"max_model_len={asked} is longer than the model's context ({model_max} tokens). "
                f"Use --max-model-len {model_max} or less."
            )
        if asked > capacity:
            raise ValueError(
                f"max_model_len={asked} does not fit in the KV cache, which holds {capacity} tokens. Lower "
                "--max-model-len, or give the cache more memory (--kv-cache-memory on CPU, "
                "--gpu-memory-utilization on GPU)."
            )
        return asked

    # ---- requests ------------------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt: str | list[int] | dict,
        params: SamplingParams | PoolingParams | None = None,
        arrival_time: float | None = None,
    ) -> None:
        """Queue a request. Raises ValueError (nothing queued) when the request cannot be served."""
        if self.pooling is not None or isinstance(params, PoolingParams):
            if self.pooling is None or not isinstance(params, PoolingParams):
                raise ValueError("This engine serves " + ("an embedding model: it takes embedding requests, "
                                 "not text generation." if self.pooling else "text generation, not embeddings."))
            if request_id in self.requests:
                raise ValueError(f"Request id {request_id!r} is already in use.")
            self.pooling.add_request(self, request_id, prompt, params.clone(),
                                     time.monotonic() if arrival_time is None else arrival_time)
            return
        # A private copy: validation fills in max_tokens, and callers may share one params object.
        params = params.clone() if params is not None else SamplingParams()
        if request_id in self.requests:
            raise ValueError(f"Request id {request_id!r} is already in use.")
        if params.truncate_prompt_tokens is not None:
            prompt = self._truncate_prompt(prompt, params.truncate_prompt_tokens)
        text, ids = validate_prompt(prompt, params, self.tokenizer, self.limits)
        # A cache hit when the caller compiled ahead (the server does, in a worker thread).
        grammar = self.structured.compile(params.structured_outputs) if params.structured_outputs else None
        rules = TokenRules.build(params, self.tokenizer)
        arrival = time.monotonic() if arrival_time is None else arrival_time
        seqs = []
        for i in range(params.n):
            p = params if params.n == 1 else params.clone(
                n=1, seed=None if params.seed is None else params.seed + i,
                prompt_logprobs=params.prompt_logprobs if i == 0 else None,  # the request's, reported once
            )
            seq = Sequence(self._next_seq_id, request_id, i, ids, p, arrival, self.model_config.eos_token_ids)
            self._next_seq_id += 1
            if p.seed is not None:
                seq.generator = torch.Generator(device=self.device)
                seq.generator.manual_seed(p.seed)
            seq.grammar = GrammarState(grammar) if grammar is not None else None
            seq.token_rules = rules
            self.output_processor.start(seq)
            seqs.append(seq)
        # Siblings wait for the first completion's prompt, then share its KV blocks (see step()).
        seqs[0].pending_forks = seqs[1:]
        self.requests[request_id] = RequestState(request_id, text, ids, seqs, arrival)
        self.scheduler.add(seqs[0])

    def _truncate_prompt(self, prompt, keep: int):
        """truncate_prompt_tokens (vLLM's): keep the last `keep` tokens (-1: as many as the context holds)."""
        if keep == -1:
            keep = self.max_model_len - 1
        text = prompt.get("prompt") if isinstance(prompt, dict) else prompt if isinstance(prompt, str) else None
        if isinstance(text, str):
            ids = self.tokenizer.encode(text)
        elif isinstance(prompt, dict):
            ids = prompt.get("prompt_token_ids")
        else:
            ids = prompt
        if not isinstance(ids, (list, tuple)) or len(ids) <= keep:
            return prompt
        return {"prompt_token_ids": list(ids)[-keep:]}

    def abort_request(self, request_id: str | list[str]) -> None:
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        for rid in ids:
            req = self.requests.get(rid)
            if req is None:
                continue
            if self.pooling is not None:
                self.pooling.abort(self, rid)
                continue
            for seq in req.seqs:
                if not seq.is_finished:
                    seq.finish_reason = "abort"
                    seq.finished_time = time.monotonic()
                    self.scheduler.finish(seq)
            self._pending.append(self._request_output(req, req.seqs))

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests) or bool(self._pending)

    # ---- the step ------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        outputs, self._pending = self._pending, []
        sched = self.scheduler.schedule()
        if sched.is_empty():
            return outputs
        if self.pooling is not None:
            return outputs + self.pooling.step(self, sched)
        advanced = False
        try:
            if self.faults is not None:
                self.faults.before_step(sched.num_tokens)
            # Before the step moves num_computed_tokens: which prompt positions report prompt_logprobs.
            prompt_rows = [(seq, r) for seq, n in sched.scheduled if (r := prompt_logprob_positions(seq, n))]
            logits, sampled = self.runner.execute(sched.scheduled)
            advanced = True
            for seq, n in sched.scheduled:
                seq.num_computed_tokens += n
                self.block_manager.cache_full_blocks(seq)
            if prompt_rows:
                record_prompt_logprobs(prompt_rows, logits[len(sampled):], self.tokenizer, self.model_config.vocab_size)
                logits = logits[: len(sampled)]
            if sampled:
                sampled, logits = self._fork_siblings(sampled, logits)
                result = self.sampler(logits, sampled)
        except EngineDeadError:
            raise  # the workers are gone: nothing more can be served (the server exits, LLM raises)
        except (MemoryError, torch.OutOfMemoryError) as exc:
            if not advanced and self._shrink_after_oom(sched, exc):
                return outputs  # nothing was computed: the same sequences run again in smaller steps
            logger.error("Out of memory in a step that cannot be made smaller: failing its requests (%s)", exc)
            return outputs + self._fail([s for s, _ in sched.scheduled], exc, OUT_OF_MEMORY_ERROR)
        except Exception as exc:  # one broken step must not take the server down
            logger.exception("Engine step failed")
            return outputs + self._fail([s for s, _ in sched.scheduled], exc)
        self.scheduler.step_succeeded()
        now = time.monotonic()
        touched: dict[str, list[Sequence]] = {}
        for i, seq in enumerate(sampled):
            if seq.num_output_tokens == 0 and seq.index == 0:
                self.prompt_tokens_total += seq.num_prompt_tokens
            token = result.token_ids[i]
            grammar_done = seq.grammar is not None and seq.grammar.accept(token)
            if self.output_processor.append_token(seq, token, result.logprobs[i], now, grammar_done):
                seq.finished_time = now
                self.scheduler.finish(seq)
            touched.setdefault(seq.request_id, []).append(seq)
        self.generation_tokens_total += len(sampled)
        for rid, seqs in touched.items():
            req = self.requests.get(rid)
            if req is not None:
                out = self._request_output(req, seqs)
                if out is not None:
                    outputs.append(out)
        return outputs

    def _fork_siblings(self, sampled: list[Sequence], logits: torch.Tensor):
        """n > 1: after the prompt of the first completion, siblings take its blocks and its logits row."""
        if not any(s.pending_forks for s in sampled):
            return sampled, logits
        rows: list[int] = []
        seqs: list[Sequence] = []
        for r, seq in enumerate(sampled):
            rows.append(r)
            seqs.append(seq)
            sched = self.scheduler
            for k, child in enumerate(seq.pending_forks):
                child.num_cached_tokens = seq.num_cached_tokens
                child.first_scheduled_time = seq.first_scheduled_time
                # Fairness: a wide fan-out joins a few siblings per step (the scheduler admits the rest from
                # its queue, their prompt from the prefix cache), and never past max_num_seqs.
                fits = k + 1 < sched.fanout_per_step and len(sched.running) < sched.max_num_seqs
                copies = self.block_manager.fork(seq, child) if fits else None
                if copies is None:
                    sched.add(child)  # no room or no free block: it recomputes (mostly from the prefix cache)
                    continue
                self.runner.copy_blocks(copies)
                self.scheduler.adopt_running(child)
                rows.append(r)
                seqs.append(child)
            seq.pending_forks = []
        return seqs, logits.index_select(0, torch.tensor(rows, device=logits.device))

    def _shrink_after_oom(self, sched, exc: BaseException) -> bool:
        """Out of memory before anything was computed: give the memory back and make later steps smaller
        (the scheduler grows them again after a run of good steps). False when the step is as small as it
        gets, i.e. one sequence and one token: then its request fails."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        if sched.num_tokens <= 1:
            return False
        tokens, seqs = self.scheduler.shrink(sched.num_tokens, len(sched.scheduled))
        logger.warning("Out of memory in a %d-token step of %d sequences (%s); continuing with at most %d tokens "
                       "and %d new sequences per step until memory allows more", sched.num_tokens,
                       len(sched.scheduled), exc, tokens, seqs)
        return True

    def _fail(self, seqs: list[Sequence], exc: BaseException, what: str = "") -> list[RequestOutput]:
        if what == OUT_OF_MEMORY_ERROR:
            message = (f"{OUT_OF_MEMORY_ERROR} while running this request ({type(exc).__name__}: {exc}). The server "
                       "is still running: retry with a shorter prompt, fewer completions (n) or max_tokens, or "
                       "start the server with a smaller --max-num-seqs / --max-num-batched-tokens.")
        else:
            message = f"The engine failed on this request: {type(exc).__name__}: {exc}"
        outputs = []
        for rid in dict.fromkeys(s.request_id for s in seqs):
            req = self.requests.get(rid)
            if req is None:
                continue
            for seq in req.seqs:
                if not seq.is_finished:
                    seq.finish_reason, seq.error = "error", message
                    seq.finished_time = time.monotonic()
                    self.scheduler.finish(seq)
            out = self._request_output(req, req.seqs)
            out.error = message
            outputs.append(out)
        return outputs

    def _request_output(self, req: RequestState, seqs: list[Sequence]) -> RequestOutput | None:
        completions: list[CompletionOutput] = []
        for seq in seqs:
            delta = self.output_processor.delta(seq, seq.is_finished)
            if delta is not None:
                completions.append(delta)
        finished = all(s.is_finished for s in req.seqs)
        if not completions and not finished:
            return None
        if finished:
            self.requests.pop(req.request_id, None)
        first = req.seqs[0]
        error = next((s.error for s in req.seqs if s.error), None)
        prompt_logprobs = None
        if first.params.prompt_logprobs is not None and not req.prompt_logprobs_sent and (
            first.num_output_tokens or finished
        ):
            prompt_logprobs, req.prompt_logprobs_sent = [None, *first.prompt_logprobs], True
        return RequestOutput(
            request_id=req.request_id,
            prompt=req.prompt,
            prompt_token_ids=req.prompt_token_ids,
            outputs=completions,
            finished=finished,
            num_cached_tokens=max(first.num_cached_tokens, 0),
            metrics=RequestMetrics(
                arrival_time=req.arrival_time,
                first_scheduled_time=first.first_scheduled_time,
                first_token_time=min((s.first_token_time for s in req.seqs if s.first_token_time), default=None),
                finished_time=max((s.finished_time or 0.0 for s in req.seqs), default=None) if finished else None,
            ),
            error=error,
            prompt_logprobs=prompt_logprobs,
        )

    def shutdown(self) -> None:
        """Stop the tensor-parallel workers, if any (idempotent; also runs at exit)."""
        self.runner.shutdown()

    def check_health(self) -> None:
        """Raises EngineDeadError when the model's workers are gone."""
        self.runner.check_health()

    # ---- chat and stats ------------------------------------------------------------------------
    def apply_chat_template(
        self, messages: list[dict], chat_template: str | None = None, add_generation_prompt: bool = True,
        **options: Any,
    ) -> list[int]:
        """The prompt ids for a chat (chat.render_chat: the one path LLM.chat and the server share); options:
        continue_final_message, tools, chat_template_kwargs."""
        template = read_template(chat_template) or self.chat_template
        return render_chat(self.tokenizer, messages, template, add_generation_prompt, self.model_name, **options)

    def get_stats(self) -> dict:
        bm = self.block_manager
        return {
            "num_requests_running": len({s.request_id for s in self.scheduler.running}),
            "num_requests_waiting": len({s.request_id for s in self.scheduler.waiting}),
            "kv_cache_usage": bm.usage(),
            "num_blocks": bm.num_blocks,
            "num_free_blocks": bm.num_free_blocks,
            "prefix_cache_queries": bm.prefix_queries,
            "prefix_cache_hits": bm.prefix_hits,
            "prompt_tokens_total": self.prompt_tokens_total,
            "generation_tokens_total": self.generation_tokens_total,
            "num_preemptions_total": self.scheduler.num_preemptions,
        }

