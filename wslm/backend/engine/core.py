"""EngineCore: token ids in, token ids out.

It takes EngineRequests (prompt ids already checked, grammar already compiled: the front end's
InputProcessor made them), and each step() schedules a batch, runs it through the executor, appends each
new token where it decides the token-level stops (engine/stop_check.py: EOS, stop token ids, lengths, the
grammar's end) and returns plain data: per completion its new token ids, their raw logprobs and, when it
ended, why. Text, stop strings and RequestOutputs are the front end's (frontend/output_processor.py): a stop
string ends a completion through abort_request(request_id, index)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import torch

from wslm.backend.engine.block_manager import BlockManager
from wslm.backend.engine.scheduler import Scheduler
from wslm.backend.engine.scheduler_output import SchedulerOutput
from wslm.backend.engine.step_inputs import prompt_logprob_positions
from wslm.backend.engine.stop_check import append_tokens
from wslm.backend.errors import EngineDeadError, ErrorKind
from wslm.backend.outputs import OUT_OF_MEMORY_ERROR
from wslm.backend.pooling_params import PoolingParams
from wslm.backend.sampling_params import SamplingParams
from wslm.backend.sequence import RequestState, Sequence
from wslm.backend.structured.compiler import GrammarState

logger = logging.getLogger("wslm.engine")


@dataclass(slots=True)
class EngineRequest:
    """One request as the core takes it (vLLM v1's EngineCoreRequest)."""

    request_id: str
    prompt: str | None  # the text, when it came as text (RequestOutput.prompt)
    prompt_token_ids: list[int]
    params: SamplingParams | PoolingParams
    arrival_time: float
    grammar: object | None = None  # structured.CompiledGrammar
    token_rules: object | None = None  # worker.token_rules.TokenRules
    images: tuple = ()  # multimodal.ImageInput of each image in the prompt
    lora_request: object | None = None  # lora.LoRARequest: the adapter the request runs with
    # Per-request additions of other features: carried as they are, also across the process boundary
    # (engine/core_client.py pickles the whole request), so a feature needs no new message type.
    extras: dict | None = None


@dataclass(slots=True)
class EngineCoreOutput:
    """What one completion (request_id, index) produced in a step: plain data, never a live Sequence."""

    request_id: str
    index: int  # which of the request's n completions
    new_token_ids: list[int]  # usually one; several when a step accepts speculated tokens
    logprobs: list | None = None  # one raw sampler entry per new token, when asked for (the front end decodes)
    finish_reason: str | None = None  # "stop" / "length" when the core ended it here
    stop_reason: int | None = None  # the stop token id that ended it
    stopped_on_token: bool = False  # the last new token is the EOS / stop token that ended it (not rendered)
    num_cached_tokens: int = 0  # prefix-cache hit of its prompt
    first_scheduled_time: float | None = None
    prompt_logprobs: list | None = None  # completion 0's, once, with its first token ({id: Logprob} per position)
    extras: dict | None = None  # per-output additions of other features (e.g. speculative-decoding counts)


@dataclass(slots=True)
class EngineCoreFailure:
    """A request that failed in this step; its sequences are finished with finish_reason "error"."""

    request_id: str
    kind: ErrorKind
    message: str


@dataclass(slots=True)
class EngineCoreOutputs:
    tokens: list[EngineCoreOutput] = field(default_factory=list)
    failed: list[EngineCoreFailure] = field(default_factory=list)


class EngineCore:
    def __init__(self, config, model_config, executor) -> None:
        self.config = config
        self.model_config = model_config
        self.executor = executor
        self.block_manager = BlockManager(executor.num_blocks, config.block_size, config.enable_prefix_caching,
                                          model_config.uniform_sliding_window)
        self.scheduler = Scheduler(config, self.block_manager)
        self.requests: dict[str, RequestState] = {}
        self._next_seq_id = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self._finished_seq_ids: list[int] = []  # told to the executor with the next step (its per-seq state)
        self.speculator = None  # spec_decode.engine_hook.Speculator when speculative decoding is on
        spec = config.speculative() if hasattr(config, "speculative") else None
        if spec is not None:
            from wslm.backend.spec_decode.engine_hook import Speculator

            self.speculator = Speculator(spec, model_config.max_model_len or 1 << 30, model_config.vocab_size)

    # ---- requests ------------------------------------------------------------------------------
    def add_request(self, req: EngineRequest) -> RequestState:
        if req.request_id in self.requests:
            raise ValueError(f"Request id {req.request_id!r} is already in use.")
        params = req.params
        if isinstance(params, PoolingParams):
            # Prefill only: one "token" of room keeps the scheduler's accounting as for any prompt.
            seq = Sequence(self._new_seq_id(), req.request_id, 0, req.prompt_token_ids, SamplingParams(max_tokens=1),
                           req.arrival_time, frozenset())
            seq.pooling = params
            seqs = [seq]
        else:
            seqs = []
            for i in range(params.n):
                p = params if params.n == 1 else params.clone(
                    n=1, seed=None if params.seed is None else params.seed + i,
                    prompt_logprobs=params.prompt_logprobs if i == 0 else None,  # the request's, reported once
                )
                # A seeded one's generator is the sampling worker's, kept by seq_id (told when it finishes).
                seq = Sequence(self._new_seq_id(), req.request_id, i, req.prompt_token_ids, p, req.arrival_time,
                               self.model_config.eos_token_ids)
                seq.grammar = GrammarState(req.grammar) if req.grammar is not None else None
                seq.token_rules = req.token_rules
                seq.images = req.images
                seq.lora_request = req.lora_request
                seqs.append(seq)
            # Siblings wait for the first completion's prompt, then share its KV blocks (see _scheduler_output).
            seqs[0].pending_forks = seqs[1:]
        state = RequestState(req.request_id, req.prompt, req.prompt_token_ids, seqs, req.arrival_time)
        self.requests[req.request_id] = state
        self.scheduler.add(seqs[0])
        return state

    def _new_seq_id(self) -> int:
        self._next_seq_id += 1
        return self._next_seq_id - 1

    def finish(self, seq: Sequence, reason: str | None = None) -> None:
        """The front end (or an abort) finished seq: its blocks go back to the pool."""
        if reason is not None:
            seq.finish_reason = reason
        if seq.finished_time is None:
            seq.finished_time = time.monotonic()
        self.scheduler.finish(seq)
        if seq.params.seed is not None:
            self._finished_seq_ids.append(seq.seq_id)

    def abort_request(self, request_id: str, index: int | None = None) -> RequestState | None:
        """Finish the request's completions (only completion `index` when given: a stop string the front end
        found); a request whose completions are all finished is forgotten."""
        req = self.requests.get(request_id)
        if req is None:
            return None
        for seq in req.seqs:
            if not seq.is_finished and (index is None or seq.index == index):
                self.finish(seq, "abort")
        self._drop_if_done(request_id)
        return req

    def _drop_if_done(self, request_id: str) -> None:
        req = self.requests.get(request_id)
        if req is not None and all(s.is_finished for s in req.seqs):
            del self.requests[request_id]

    def drop(self, request_id: str) -> None:
        """Forget a request (its sequences finished): a failed one, or an embedding request answered."""
        self.requests.pop(request_id, None)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    # ---- the step ------------------------------------------------------------------------------
    def step(self) -> EngineCoreOutputs:
        out = EngineCoreOutputs()
        if self.speculator is not None:
            self.speculator.propose(self.scheduler.running, self.executor.decode_row_budget())
        sched = self.scheduler.schedule()
        if sched.is_empty():
            return out
        try:
            so, forks = self._scheduler_output(sched.scheduled)
            if self.speculator is not None:
                so.spec = self.speculator.batch(sched.scheduled)
            started = time.perf_counter()
            result = self.executor.execute(so)
            if self.speculator is not None:
                self.speculator.timed(sched.scheduled, time.perf_counter() - started)
        except EngineDeadError:
            raise  # the workers are gone: nothing more can be served (the server exits, LLM raises)
        except (MemoryError, torch.OutOfMemoryError) as exc:
            if self._shrink_after_oom(sched, exc):
                return out  # nothing was computed: the same sequences run again in smaller steps
            logger.error("Out of memory in a step that cannot be made smaller: failing its requests (%s)", exc)
            message = (f"{OUT_OF_MEMORY_ERROR} while running this request ({type(exc).__name__}: {exc}). The server "
                       "is still running: retry with a shorter prompt, fewer completions (n) or max_tokens, or "
                       "start the server with a smaller --max-num-seqs / --max-num-batched-tokens.")
            out.failed = self._fail([s for s, _ in sched.scheduled], ErrorKind.OUT_OF_MEMORY, message)
            for failure in out.failed:
                self.drop(failure.request_id)
            return out
        except Exception as exc:  # one broken step must not take the server down
            logger.exception("Engine step failed")
            message = f"The engine failed on this request: {type(exc).__name__}: {exc}"
            out.failed = self._fail([s for s, _ in sched.scheduled], ErrorKind.ENGINE, message)
            for failure in out.failed:
                self.drop(failure.request_id)
            return out
        new_tokens = result.spec_token_ids or [[t] for t in result.token_ids]
        spec_runs = {seq.seq_id: len(toks) for seq, toks in zip(so.sample_seqs, new_tokens) if seq.spec_token_ids}
        for seq, n in sched.scheduled:
            if seq.seq_id in spec_runs:  # the verified run's KV: its last token and the drafts accepted
                n = spec_runs[seq.seq_id]
                seq.num_computed_tokens += n
                self.speculator.verified(seq, n, self.block_manager)
            else:
                seq.num_computed_tokens += n
            self.block_manager.cache_full_blocks(seq)
        for (seq, _), entries in zip(so.prompt_rows, result.prompt_logprobs):
            seq.prompt_logprobs.extend(entries)
        self._fork(so, forks)
        self.scheduler.step_succeeded()
        for i, seq in enumerate(so.sample_seqs):
            first = seq.num_output_tokens == 0
            if first and seq.index == 0:
                self.prompt_tokens_total += seq.num_prompt_tokens
            # One token, or after a speculative run the accepted drafts and the bonus token, in order.
            sampled = new_tokens[i]
            logprobs = result.spec_logprobs[i] if result.spec_logprobs else [result.logprobs[i]]
            if all(lp is None for lp in logprobs):
                logprobs = None
            app = append_tokens(seq, sampled, self.model_config.max_model_len)
            self.generation_tokens_total += len(app.token_ids)
            out.tokens.append(EngineCoreOutput(
                seq.request_id, seq.index, app.token_ids,
                None if logprobs is None else logprobs[: len(app.token_ids)],
                app.finish_reason, app.stop_reason, app.stopped_on_token, max(seq.num_cached_tokens, 0),
                seq.first_scheduled_time,
                seq.prompt_logprobs if first and seq.index == 0 and seq.params.prompt_logprobs is not None else None,
            ))
            if app.finish_reason is not None:
                seq.stop_reason = app.stop_reason
                self.finish(seq, app.finish_reason)
                self._drop_if_done(seq.request_id)
        return out

    def step_pooling(self) -> tuple[torch.Tensor | None, list[Sequence], list[EngineCoreFailure]]:
        """Embedding requests: run the scheduled prompt chunks; the hidden states of the sequences whose
        prompt is now complete (pooling/decoder.py turns them into vectors and finishes them)."""
        sched = self.scheduler.schedule()
        if sched.is_empty():
            return None, [], []
        try:
            hidden, done = self.executor.execute_pooling(sched.scheduled)
        except Exception as exc:  # noqa: BLE001 - one broken step fails its requests, not the server
            logger.exception("Embedding step failed")
            message = f"The engine failed on this request: {type(exc).__name__}: {exc}"
            return None, [], self._fail([s for s, _ in sched.scheduled], ErrorKind.ENGINE, message)
        for seq, n in sched.scheduled:
            seq.num_computed_tokens += n
            self.block_manager.cache_full_blocks(seq)
        return hidden, done, []

    def _scheduler_output(self, scheduled: list[tuple[Sequence, int]]) -> tuple[SchedulerOutput, dict]:
        """Who samples from which row, and which n > 1 siblings fork off their first completion this step
        (decided before the step, so that the executor samples them with the rest; the blocks are shared
        after it, in _fork, once the prompt's KV is written)."""
        prompt_rows = [(seq, r) for seq, n in scheduled if (r := prompt_logprob_positions(seq, n))]
        sample_seqs: list[Sequence] = []
        rows: list[int] = []
        forks: dict[int, list[Sequence]] = {}
        sched, bm = self.scheduler, self.block_manager
        running, free = len(sched.running), bm.num_free_blocks
        row = -1
        for seq, n in scheduled:
            if seq.num_computed_tokens + n < seq.num_tokens:
                continue  # a prompt chunk short of the end: no token yet
            row += 1
            rows.append(row)
            sample_seqs.append(seq)
            if not seq.pending_forks:
                continue
            # Fairness: a wide fan-out joins a few siblings per step (the scheduler admits the rest from its
            # queue, their prompt from the prefix cache), and never past max_num_seqs; a sibling whose last
            # block is partial needs a free block for its own copy of it.
            partial = (seq.num_computed_tokens + n) % bm.block_size != 0
            planned = forks[seq.seq_id] = []
            for k, child in enumerate(seq.pending_forks):
                if not (k + 1 < sched.fanout_per_step and running < sched.max_num_seqs and (free > 0 or not partial)):
                    break
                running += 1
                free -= partial
                planned.append(child)
                rows.append(row)
                sample_seqs.append(child)
        finished, self._finished_seq_ids = self._finished_seq_ids, []
        return SchedulerOutput(scheduled, sample_seqs, rows, prompt_rows, finished), forks

    def _fork(self, so: SchedulerOutput, forks: dict[int, list[Sequence]]) -> None:
        """After the step wrote the prompt's KV: the planned siblings take their parent's blocks; the rest
        wait in the queue and recompute (mostly from the prefix cache)."""
        for seq in so.sample_seqs:
            planned = forks.get(seq.seq_id)
            if planned is None:
                continue
            for child in seq.pending_forks:
                if child not in planned:
                    self.scheduler.add(child)
                    continue
                child.num_cached_tokens = seq.num_cached_tokens
                child.first_scheduled_time = seq.first_scheduled_time
                copies = self.block_manager.fork(seq, child)
                if copies is None:  # cannot happen: the plan counted the free blocks
                    raise RuntimeError("a planned fork found no free KV block")
                self.executor.copy_blocks(copies)
                self.scheduler.adopt_running(child)
            seq.pending_forks = []

    def _shrink_after_oom(self, sched, exc: BaseException) -> bool:
        """Out of memory before anything was computed: give the memory back and make later steps smaller
        (the scheduler grows them again after a run of good steps). False when the step is as small as it
        gets, i.e. one sequence and one token: then its request fails."""
        if self.executor.device.type == "cuda":
            torch.cuda.empty_cache()
        if sched.num_tokens <= 1:
            return False
        tokens, seqs = self.scheduler.shrink(sched.num_tokens, len(sched.scheduled))
        logger.warning("Out of memory in a %d-token step of %d sequences (%s); continuing with at most %d tokens "
                       "and %d new sequences per step until memory allows more", sched.num_tokens,
                       len(sched.scheduled), exc, tokens, seqs)
        return True

    def _fail(self, seqs: list[Sequence], kind: ErrorKind, message: str) -> list[EngineCoreFailure]:
        failed = []
        for rid in dict.fromkeys(s.request_id for s in seqs):
            req = self.requests.get(rid)
            if req is None:
                continue
            for seq in req.seqs:
                if not seq.is_finished:
                    seq.error = message
                    self.finish(seq, "error")
            failed.append(EngineCoreFailure(rid, kind, message))
        return failed

    # ---- stats ---------------------------------------------------------------------------------
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
            **(self.speculator.stats() if self.speculator is not None else {}),
        }
