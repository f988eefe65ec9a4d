"""Token-level stops are decided once, in the engine core where the token is appended (engine/stop_check.py),
and the core hands the front end plain data: a scripted executor feeds the real EngineCore and scheduler."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import pytest
import torch

from wslm.backend.config import EngineConfig
from wslm.backend.engine import stop_check
from wslm.backend.engine.core import EngineCore, EngineRequest
from wslm.backend.engine.step_inputs import ModelRunnerOutput
from wslm.backend.sampling_params import SamplingParams

EOS = 2


class ScriptedExecutor:
    """Samples the next token of a fixed script for every sequence (no model)."""

    num_blocks = 64
    device = torch.device("cpu")

    def __init__(self, script: list[int]) -> None:
        self.script = script

    def execute(self, so) -> ModelRunnerOutput:
        ids = [self.script[min(s.num_output_tokens, len(self.script) - 1)] for s in so.sample_seqs]
        return ModelRunnerOutput(ids, [None] * len(ids), [[] for _ in so.prompt_rows])

    def copy_blocks(self, copies) -> None:
        pass


def _core(script: list[int], max_model_len: int = 1000) -> EngineCore:
    mc = SimpleNamespace(uniform_sliding_window=None, eos_token_ids=frozenset({EOS}), max_model_len=max_model_len)
    return EngineCore(EngineConfig(block_size=16, max_num_seqs=8, max_num_batched_tokens=256), mc,
                      ScriptedExecutor(script))


def _run(core: EngineCore, params: SamplingParams, prompt=(5, 6, 7), rid="r") -> list:
    core.add_request(EngineRequest(rid, None, list(prompt), params, 0.0))
    outs = []
    while core.has_unfinished_requests():
        step = core.step()
        outs.extend(step.tokens)
    assert core.block_manager.num_free_blocks == core.block_manager.num_blocks  # blocks back at the stop
    return outs


@pytest.mark.parametrize("params, script, n_tokens, reason, stop_reason, on_token", [
    (SamplingParams(max_tokens=50), [9, 9, EOS, 9], 3, "stop", None, True),  # EOS
    (SamplingParams(max_tokens=50, ignore_eos=True), [9, EOS, 9], 50, "length", None, False),
    (SamplingParams(max_tokens=50, min_tokens=4), [EOS], 4, "stop", None, True),  # EOS held back till min_tokens
    (SamplingParams(max_tokens=50, min_tokens=2), [9, EOS, EOS], 2, "stop", None, True),
    (SamplingParams(max_tokens=50, stop_token_ids=[11]), [9, 11, 9], 2, "stop", 11, True),
    (SamplingParams(max_tokens=4), [9], 4, "length", None, False),
])
def test_stops_are_decided_where_the_token_is_appended(params, script, n_tokens, reason, stop_reason, on_token):
    outs = _run(_core(script), params)
    assert [len(o.new_token_ids) for o in outs] == [1] * n_tokens
    assert all(o.finish_reason is None for o in outs[:-1])
    last = outs[-1]
    assert (last.finish_reason, last.stop_reason, last.stopped_on_token) == (reason, stop_reason, on_token)


def test_model_length_ends_a_sequence():
    outs = _run(_core([9], max_model_len=10), SamplingParams(max_tokens=None))
    assert len(outs) == 7 and outs[-1].finish_reason == "length"  # 3 prompt + 7 = the model's 10 tokens


def test_grammar_end_stops_even_below_min_tokens():
    class Grammar:  # complete after its third token
        def __init__(self):
            self.n = 0

        def accept(self, token):
            self.n += 1
            return self.n == 3

    core = _core([9])
    core.add_request(EngineRequest("g", None, [5, 6], SamplingParams(max_tokens=20, min_tokens=10), 0.0))
    core.requests["g"].seqs[0].grammar = Grammar()
    outs = []
    while core.has_unfinished_requests():
        outs.extend(core.step().tokens)
    assert len(outs) == 3 and (outs[-1].finish_reason, outs[-1].stopped_on_token) == ("stop", False)


def test_outputs_are_plain_data_and_n_completions_stop_on_their_own():
    outs = _run(_core([9, 9, 9]), SamplingParams(n=3, max_tokens=3, temperature=1.0, seed=1))
    assert sorted(o.index for o in outs if o.finish_reason == "length") == [0, 1, 2]
    assert pickle.loads(pickle.dumps(outs)) == outs  # crosses a process boundary as it is
    assert all(type(v) in (str, int, float, bool, list, type(None)) for o in outs for v in
               (o.request_id, o.index, o.new_token_ids, o.finish_reason, o.stop_reason, o.num_cached_tokens))


def test_several_tokens_in_one_step_stop_at_the_first_stop():
    seq = SimpleNamespace(output_token_ids=[], prompt_token_ids=[1], grammar=None, eos_token_ids=frozenset({EOS}),
                          params=SamplingParams(max_tokens=10))
    seq_type = type("S", (), {"num_output_tokens": property(lambda s: len(s.output_token_ids)),
                              "num_tokens": property(lambda s: 1 + len(s.output_token_ids))})
    s = seq_type()
    s.__dict__.update(vars(seq))
    got = stop_check.append_tokens(s, [7, EOS, 8], max_model_len=100)
    assert got.token_ids == [7, EOS] and got.finish_reason == "stop" and s.output_token_ids == [7, EOS]


def test_abort_by_request_id_and_index_frees_one_completion():
    core = _core([9])
    core.add_request(EngineRequest("a", None, [5, 6, 7], SamplingParams(n=2, max_tokens=30, temperature=1.0), 0.0))
    for _ in range(3):
        core.step()
    core.abort_request("a", 1)  # a stop string the front end found in completion 1
    assert [s.is_finished for s in core.requests["a"].seqs] == [False, True]
    core.abort_request("a")
    assert "a" not in core.requests and core.block_manager.num_free_blocks == core.block_manager.num_blocks


def test_each_token_is_checked_once_and_only_in_the_core(monkeypatch):
    calls = []
    original = stop_check.check_stop
    monkeypatch.setattr(stop_check, "check_stop", lambda *a: calls.append(a[1]) or original(*a))
    outs = _run(_core([9, 9, 9, EOS]), SamplingParams(max_tokens=50, n=2, temperature=1.0, seed=2))
    assert len(calls) == sum(len(o.new_token_ids) for o in outs) == 8  # 4 tokens x 2 completions, once each
    import wslm.backend.frontend.output_processor as front
    assert "check_stop" not in vars(front) and "eos_token_ids" not in open(front.__file__).read()
