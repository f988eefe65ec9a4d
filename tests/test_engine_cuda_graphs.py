"""The CUDA-graph decode path's buffer handling, checked on CPU: 'replay' reruns the forward over the
static buffers, which is exactly what a captured graph computes."""

from wslm.backend import LLM, SamplingParams
from wslm.backend.platforms.cuda.graphs import DecodeGraphs, batch_size_ladder


class ReplayOnCpu(DecodeGraphs):
    def _capture_one(self, b, pool):
        self.graphs[b] = b

    def _replay(self, b):
        return self._forward(b)


def test_ladder():
    assert batch_size_ladder(1) == [1]
    assert batch_size_ladder(20) == [1, 2, 4, 8, 16]
    assert batch_size_ladder(256)[-1] == 256


def test_decode_through_padded_static_buffers_matches_eager(tiny_models):
    prompts = [f"Request {i}: " + "word " * (3 + 5 * i) for i in range(5)]  # 5 -> padded to 8
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    llm = LLM(str(tiny_models["llama"]), kv_cache_memory=16 << 20, max_num_seqs=8, max_model_len=256)
    runner = llm.llm_engine.executor.runner
    if runner.cpu_plan is not None:  # the batched torch step, not the C rows step (which rounds otherwise)
        runner.cpu_plan.set_native(None)
    expected = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    graphs = ReplayOnCpu(runner.model, runner.kv_caches, 8, 256, runner.block_size)
    assert graphs.capture()
    runner.graphs = graphs
    calls = []
    original = graphs.run
    graphs.run = lambda *a: calls.append(a[0].shape[0]) or original(*a)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert got == expected
    assert calls and max(calls) == 5
