"""After the core's step: fold each completion's new token ids (plain data from the core, see
engine/core.py EngineCoreOutput) into its text, check stop strings, build RequestOutput deltas.

Token-level stops (EOS, stop token ids, lengths, the grammar's end) were decided by the core; only stop
*strings* are decided here, since they need the text: such a completion is reported to the caller, which
aborts it in the core by request id and index. The core's Sequence never crosses into this layer: the front
end keeps its own per-completion state (Completion) so that the core may run in another process."""

from __future__ import annotations

from dataclasses import dataclass, field

from wslm.backend.errors import ErrorKind
from wslm.backend.frontend.detokenizer import Detokenizer
from wslm.backend.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from wslm.backend.sampling_params import SamplingParams


@dataclass(slots=True, eq=False)
class Completion:
    """The front end's view of one of a request's n completions: its tokens, text and what was sent."""

    index: int
    prompt_token_ids: list[int]
    params: SamplingParams
    output_token_ids: list[int] = field(default_factory=list)
    output_text: str = ""
    # Detokenizer state.
    prefix_offset: int = 0
    read_offset: int = 0
    sent_text_len: int = 0
    sent_token_len: int = 0
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    cumulative_logprob: float = 0.0
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    error: str | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True, eq=False)
class TrackedRequest:
    """A request the front end waits on (the core's side is engine/core.py RequestState)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    completions: list[Completion]
    num_cached_tokens: int = 0
    first_scheduled_time: float | None = None
    prompt_logprobs: list | None = None
    prompt_logprobs_sent: bool = False

    @property
    def finished(self) -> bool:
        return all(c.is_finished for c in self.completions)


@dataclass(slots=True)
class _OneToken:
    """One token of a multi-token EngineCoreOutput, shaped like one."""

    new_token_ids: list[int]
    logprobs: list | None
    finish_reason: str | None
    stop_reason: str | int | None
    stopped_on_token: bool


class OutputProcessor:
    def __init__(self, tokenizer, max_model_len: int) -> None:
        self.tokenizer = tokenizer
        self.detokenizer = Detokenizer(tokenizer)
        self.max_model_len = max_model_len
        self.requests: dict[str, TrackedRequest] = {}

    # ---- requests ------------------------------------------------------------------------------
    def add(self, request_id: str, prompt: str | None, prompt_token_ids: list[int], params: SamplingParams,
            arrival_time: float) -> TrackedRequest:
        completions = [Completion(i, prompt_token_ids, params) for i in range(params.n)]
        for c in completions:
            self.start(c)
        tracked = TrackedRequest(request_id, prompt, prompt_token_ids, params, arrival_time, completions)
        self.requests[request_id] = tracked
        return tracked

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def start(self, c: Completion) -> None:
        self.detokenizer.start(c)

    def abort(self, request_id: str, now: float) -> RequestOutput | None:
        """The caller aborted the request in the core: its last output (finish_reason "abort")."""
        tracked = self.requests.get(request_id)
        if tracked is None:
            return None
        for c in tracked.completions:
            if not c.is_finished:
                c.finish_reason, c.finished_time = "abort", now
        return self._request_output(tracked, tracked.completions)

    def fail(self, request_id: str, kind: ErrorKind, message: str, now: float) -> RequestOutput | None:
        """The core failed the request (finish_reason "error")."""
        tracked = self.requests.get(request_id)
        if tracked is None:
            return None
        for c in tracked.completions:
            if not c.is_finished:
                c.finish_reason, c.error, c.finished_time = "error", message, now
        ro = self._request_output(tracked, tracked.completions)
        ro.error, ro.error_kind = message, kind
        return ro

    # ---- a step's outputs ----------------------------------------------------------------------
    def process(self, outputs: list, now: float) -> tuple[list[RequestOutput], list[tuple[str, int]]]:
        """The RequestOutputs of a step's EngineCoreOutputs, and the (request id, index) of the completions
        a stop string ended, which the caller aborts in the core."""
        touched: dict[str, list[Completion]] = {}
        stopped: list[tuple[str, int]] = []
        for out in outputs:
            tracked = self.requests.get(out.request_id)
            if tracked is None:
                continue  # aborted here while the core ran a step (a separate process runs ahead)
            c = tracked.completions[out.index]
            if c.is_finished:
                continue
            if out.index == 0:
                tracked.num_cached_tokens = out.num_cached_tokens
                tracked.first_scheduled_time = out.first_scheduled_time
            if out.prompt_logprobs is not None:
                tracked.prompt_logprobs = out.prompt_logprobs
            if self.append(c, out, now) and out.finish_reason is None:
                stopped.append((out.request_id, out.index))
            group = touched.setdefault(out.request_id, [])
            if c not in group:
                group.append(c)
        results = []
        for rid, completions in touched.items():
            ro = self._request_output(self.requests[rid], completions)
            if ro is not None:
                results.append(ro)
        return results, stopped

    def append(self, c: Completion, out, now: float) -> bool:
        """Fold out's new tokens into c; True when c is now finished (by the core, or by a stop string).
        Several tokens (a speculative run) are folded one by one when stop strings are set, so that one of
        them ending a stop string ends the completion there, as it would without speculation."""
        ids = out.new_token_ids
        if len(ids) > 1 and c.params.stop:
            last = len(ids) - 1
            for k, token in enumerate(ids):
                part = _OneToken([token], None if out.logprobs is None else [out.logprobs[k]],
                                 out.finish_reason if k == last else None, out.stop_reason if k == last else None,
                                 out.stopped_on_token and k == last)
                if self._append(c, part, now):
                    return True
            return False
        return self._append(c, out, now)

    def _append(self, c: Completion, out, now: float) -> bool:
        if c.first_token_time is None:
            c.first_token_time = now
        c.last_token_time = now
        p = c.params
        if out.logprobs is not None:
            for token, info in zip(out.new_token_ids, out.logprobs):
                self._add_logprobs(c, token, info)
        c.output_token_ids.extend(out.new_token_ids)
        # The token that stops the sequence stays in token_ids but not in the text (as vLLM renders it), unless
        # include_stop_str_in_output: visible with skip_special_tokens=False or a plain-word stop token id.
        hide = out.stopped_on_token and not p.include_stop_str_in_output
        can_stop = c.num_output_tokens >= p.min_tokens
        prev_len = len(c.output_text)
        self.detokenizer.update(c, hide_last=hide)
        if out.finish_reason is None:
            if can_stop and (stop := self.detokenizer.check_stop_strings(c, prev_len)) is not None:
                c.finish_reason, c.stop_reason, c.finished_time = "stop", stop, now
                return True
            return False
        c.finish_reason, c.stop_reason, c.finished_time = out.finish_reason, out.stop_reason, now
        prev_len = len(c.output_text)
        self.detokenizer.flush(c, hide_last=hide)
        if can_stop and (stop := self.detokenizer.check_stop_strings(c, prev_len)) is not None:
            c.finish_reason, c.stop_reason = "stop", stop
        return True

    def _add_logprobs(self, c: Completion, token: int, info) -> None:
        chosen, rank, top_ids, top_vals, *wanted_ranks = info
        decode = self.tokenizer.decode
        entry = {token: Logprob(chosen, rank, decode([token]))}
        # The top ids rank 1, 2, ...; requested ids (logprob_token_ids) come with their own ranks.
        ranks = wanted_ranks[0] if wanted_ranks else range(1, len(top_ids) + 1)
        for r, tid, val in zip(ranks, top_ids, top_vals):
            if tid not in entry:
                entry[tid] = Logprob(val, r, decode([tid]))
        c.logprobs.append(entry)
        c.cumulative_logprob += chosen

    def delta(self, c: Completion, finished: bool) -> CompletionOutput | None:
        """What c produced since the last delta; None when nothing new is ready."""
        text_end = self.detokenizer.sendable_text_len(c) if not finished else len(c.output_text)
        text = c.output_text[c.sent_text_len : text_end]
        token_ids = c.output_token_ids[c.sent_token_len :]
        if not text and not token_ids and not finished:
            return None
        logprobs = c.logprobs[c.sent_token_len :] if c.params.logprobs is not None else None
        c.sent_text_len = max(text_end, c.sent_text_len)
        c.sent_token_len = c.num_output_tokens
        return CompletionOutput(
            index=c.index,
            text=text,
            token_ids=token_ids,
            cumulative_logprob=c.cumulative_logprob if c.params.logprobs is not None else None,
            logprobs=logprobs,
            finish_reason=c.finish_reason if finished else None,
            stop_reason=c.stop_reason if finished else None,
        )

    def _request_output(self, req: TrackedRequest, completions: list[Completion]) -> RequestOutput | None:
        deltas = [d for c in completions if (d := self.delta(c, c.is_finished)) is not None]
        finished = req.finished
        if not deltas and not finished:
            return None
        if finished:
            self.requests.pop(req.request_id, None)
        first = req.completions[0]
        prompt_logprobs = None
        if req.params.prompt_logprobs is not None and not req.prompt_logprobs_sent and (
            first.num_output_tokens or finished
        ):
            prompt_logprobs, req.prompt_logprobs_sent = [None, *self._decoded(req.prompt_logprobs or [])], True
        return RequestOutput(
            request_id=req.request_id,
            prompt=req.prompt,
            prompt_token_ids=req.prompt_token_ids,
            outputs=deltas,
            finished=finished,
            num_cached_tokens=req.num_cached_tokens,
            metrics=RequestMetrics(
                arrival_time=req.arrival_time,
                first_scheduled_time=req.first_scheduled_time,
                first_token_time=min((c.first_token_time for c in req.completions if c.first_token_time), default=None),
                finished_time=max((c.finished_time or 0.0 for c in req.completions), default=None) if finished else None,
            ),
            error=next((c.error for c in req.completions if c.error), None),
            prompt_logprobs=prompt_logprobs,
        )

    def _decoded(self, entries: list[dict]) -> list[dict]:
        """prompt_logprobs as the worker computed them, with each token's text (the tokenizer is ours)."""
        decode = self.tokenizer.decode
        for entry in entries:
            for tid, lp in entry.items():
                if lp.decoded_token is None:
                    lp.decoded_token = decode([tid])
        return entries
