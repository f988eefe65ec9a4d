"""One sequence's decode step in C (wslm/backend/platforms/cpu/decode_native.py, wslm/kernels/cpu_layer.c): on the same
inputs and KV pool it gives the eager fast path's logits to bf16 rounding and writes the same key and
value to the same slot and nothing else, for every weight kind and layer variant it takes, in bfloat16 and
float32; lone chats take it and batches do not; on the demo GGUF its greedy tokens are the dequantized
model's own; the AVX2 build of the kernels (what CPUs without AVX-512 run) gives the same results."""

from __future__ import annotations

import pytest
import torch
from test_modeling_families import make_family_model
from test_quant_engine import CHAT, _teacher_forced_agreement

from wslm.backend import LLM, SamplingParams
from wslm.backend.platforms.cpu.decode_native import ENV_VAR, why_not
from wslm.kernels import cpu_gemv

pytestmark = pytest.mark.skipif(
    cpu_gemv.library() is None, reason="no C compiler: the C kernels are not built"
)


def _one_step(llm: LLM, prompt: list[int]):
    """The inputs of a one-sequence decode step past a block boundary, with the pool as it stands then."""
    runner = llm.llm_engine.executor.runner
    native = runner.native
    runner.cpu_plan.set_native(None)  # the eager step runs: its inputs are captured
    captured = []
    tensorize = runner.tensorize

    def spy(step):
        out = tensorize(step)
        if out[2].max_seqlen_q == 1:
            captured.append(out)
        return out

    runner.tensorize = spy
    try:
        llm.generate(
            [{"prompt_token_ids": prompt}], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
        )
    finally:
        runner.tensorize = tensorize
        runner.cpu_plan.set_native(native)
    return captured[-1]


def _compare(llm: LLM, prompt: list[int]) -> tuple[float, float]:
    """(largest logit difference / largest logit, largest difference of the new key|value / largest value)
    between the C step and the eager one on the same inputs; asserts nothing else in the pool moved."""
    runner = llm.llm_engine.executor.runner
    step = _one_step(llm, prompt)
    before = runner.kv_pool.clone()
    want = runner.cpu_decode.run(*step)
    want_pool = runner.kv_pool.clone()
    runner.kv_pool.copy_(before)
    got = runner.native.run(*step)
    got_pool = runner.kv_pool.clone()
    slot = int(step[2].slot_mapping[0])
    flat = [p.view(p.shape[0], 2, -1, *p.shape[4:]).float() for p in (before, want_pool, got_pool)]
    others = torch.ones(flat[0].shape[2], dtype=torch.bool)
    others[slot] = False
    assert torch.equal(flat[2][:, :, others], flat[0][:, :, others])  # only this token's slot written
    new_want, new_got = flat[1][:, :, slot], flat[2][:, :, slot]
    assert got.shape == want.shape and got.dtype == torch.float32
    logit_err = float((got - want).abs().max() / want.abs().max())
    kv_err = float((new_got - new_want).abs().max() / new_want.abs().max())
    return logit_err, kv_err


PROMPT = "Once upon a time, in a village by the sea, there lived an old clockmaker"


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])  # float32: dtype=auto on CPUs without bf16
@pytest.mark.parametrize(
    "arch,kw",
    [
        ("llama", {"quantization": "int4"}),  # GQA, int4 products
        ("qwen2", {"quantization": "int8"}),  # int8 products with q/k/v biases
        ("llama", {}),  # dense weights
    ],
)
def test_c_step_matches_the_eager_step(arch, kw, dtype, tiny_models, demo_tok):
    llm = LLM(str(tiny_models[arch]), dtype=dtype, kv_cache_memory=16 << 20, block_size=8,
              max_model_len=256, enforce_eager=True, **kw)  # fmt: skip
    runner = llm.llm_engine.executor.runner
    assert runner.native is not None, why_not(runner.model, runner.kv_pool)
    logit_err, kv_err = _compare(llm, demo_tok.encode(PROMPT))
    # The same ops and kernels; attention and the norms sum in another order (bf16: 2^-8 = 0.004 a rounding).
    assert logit_err < 0.05 and kv_err < 0.05


def test_c_step_with_qk_norm(demo_tok, tmp_path):
    folder, _ = make_family_model(tmp_path / "qwen3", "qwen3", demo_tok)  # per-head q/k RMSNorm
    llm = LLM(str(folder), dtype="bfloat16", kv_cache_memory=16 << 20, block_size=8, max_model_len=256,
              enforce_eager=True)  # fmt: skip
    runner = llm.llm_engine.executor.runner
    assert runner.native is not None, why_not(runner.model, runner.kv_pool)
    logit_err, kv_err = _compare(llm, demo_tok.encode(PROMPT))
    assert logit_err < 0.05 and kv_err < 0.05



@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("arch,kw", [("llama", {"quantization": "int4"}), ("qwen2", {"quantization": "int8"}),
                                     ("llama", {})])  # fmt: skip
def test_a_team_of_threads_gives_the_one_thread_step(arch, kw, dtype, tiny_models, demo_tok):
    """With threads the step runs as one team (products split by rows, attention by head and, in a long
    context, by stretches merged after): the one-thread step's bits, short context or long (the stretches
    follow from the context length, not the thread count, so a greedy answer does not depend on the threads)."""
    llm = LLM(str(tiny_models[arch]), dtype=dtype, kv_cache_memory=16 << 20, block_size=8,
              max_model_len=512, enforce_eager=True, **kw)  # fmt: skip
    for prompt in (demo_tok.encode(PROMPT), [(i * 97) % 900 + 5 for i in range(480)]):  # 480: two stretches
        assert_same_bits_on_threads(llm, prompt)


def assert_same_bits_on_threads(llm: LLM, prompt: list[int]) -> None:
    """The C step after prompt gives the same logits and KV pool on 1, 2 and 3 threads."""
    runner = llm.llm_engine.executor.runner
    step = _one_step(llm, prompt)
    before = runner.kv_pool.clone()
    results = []
    for threads in (1, 2, 3):
        runner.kv_pool.copy_(before)
        results.append((runner.native.run(*step, threads=threads), runner.kv_pool.clone()))
    (one, pool), teams = results[0], results[1:]
    for logits, team_pool in teams:
        assert torch.equal(logits, one) and torch.equal(team_pool, pool)


def test_the_thread_count_follows_what_the_steps_measure():
    from wslm.backend.platforms.cpu.tuning import StepThreads

    def run(chooser, cost, steps):
        used = []
        for _ in range(steps):
            n = chooser.pick(2)
            chooser.record(n, cost[n])
            used.append(n)
        return used

    chooser = StepThreads()
    assert run(chooser, {1: 1.0, 2: 0.6}, 40)[-10:] == [2] * 10  # idle machine: the team
    used = run(chooser, {1: 1.0, 2: 3.0}, 60)  # then something else keeps a core busy: one slow step, a try
    assert used[4:20] == [1] * 16 and used.count(2) <= 1 + 2 * StepThreads.TRIES
    busy = run(chooser, {1: 1.0, 2: 3.0}, 3000)
    assert busy.count(2) < 40  # losing tries wait longer each time
    assert run(chooser, {1: 1.0, 2: 0.6}, 3000)[-10:] == [2] * 10  # idle again: back to the team
    assert StepThreads().pick(1) == 1

@pytest.mark.parametrize("dtype", ["auto", "float32"])
def test_lone_chats_take_it_and_agree_with_the_dequantized_demo(dtype, demo_llm, monkeypatch):
    monkeypatch.setenv("WSLM_GGUF_DEQUANTIZE", "0")
    llm = LLM("demo", dtype=dtype, kv_cache_memory=64 << 20, max_model_len=512, max_num_seqs=4,
              enforce_eager=True)  # fmt: skip
    runner = llm.llm_engine.executor.runner
    assert runner.native is not None, why_not(runner.model, runner.kv_pool)
    prompt = llm.llm_engine.apply_chat_template(CHAT, None, True)
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    tokens = llm.generate([{"prompt_token_ids": prompt}], params)[0].outputs[0].token_ids
    assert runner.native.steps >= 63  # every decode step of the lone chat ran in C
    # Given the same prefix, the dequantized float32 model picks the same next token almost always.
    assert _teacher_forced_agreement(demo_llm, prompt, list(tokens)) >= 0.9
    steps = runner.native.steps
    outs = llm.generate([{"prompt_token_ids": prompt}] * 3, SamplingParams(temperature=0, max_tokens=8))
    assert runner.native.steps == steps + 7  # a small batch's decode steps run in C too (decode_rows.py)
    assert all(list(o.outputs[0].token_ids) == list(tokens[:8]) for o in outs)  # each row the lone chat's bits
    manager = llm.llm_engine.block_manager
    assert manager.num_free_blocks == manager.num_blocks


def test_a_small_batch_of_chats_decodes_in_c_each_as_it_would_alone(monkeypatch):
    """Chats of different lengths in one decode step (decode_rows.py: each row its own block table and
    length): every chat gets the tokens it gets alone, whatever else is in the batch."""
    monkeypatch.setenv("WSLM_GGUF_DEQUANTIZE", "0")
    llm = LLM("demo", kv_cache_memory=64 << 20, max_model_len=512, max_num_seqs=4, enforce_eager=True,
              enable_prefix_caching=False)  # fmt: skip
    native = llm.llm_engine.executor.runner.native
    assert native is not None
    chats = [[{"role": "user", "content": c}] for c in
             ("Hi!", "Name three colours.", "Write one sentence about a lighthouse on a rocky coast at night.")]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    alone = [llm.chat(c, params)[0].outputs[0].token_ids for c in chats]
    steps = native.steps
    together = [o.outputs[0].token_ids for o in llm.chat(chats, params)]
    assert native.steps == steps + 11  # one C step for all three chats' rows each time
    assert together == alone


def test_off_switch_and_reasons(tiny_models, monkeypatch):
    monkeypatch.setenv(ENV_VAR, "0")
    llm = LLM(str(tiny_models["llama"]), dtype="bfloat16", kv_cache_memory=16 << 20, max_model_len=128,
              enforce_eager=True)  # fmt: skip
    runner = llm.llm_engine.executor.runner
    assert runner.native is None and why_not(runner.model, runner.kv_pool) == f"{ENV_VAR}=0"
    monkeypatch.delenv(ENV_VAR)
    fp8 = LLM(str(tiny_models["llama"]), dtype="bfloat16", kv_cache_dtype="fp8", kv_cache_memory=16 << 20,
              max_model_len=128, enforce_eager=True)  # fmt: skip
    runner = fp8.llm_engine.executor.runner
    assert runner.native is None and "fast decode path" in why_not(runner.model, runner.kv_pool)


def test_the_batch_graph_compiles_when_the_first_batch_comes(tiny_models, demo_tok, monkeypatch):
    import shutil

    if not (shutil.which("g++") or shutil.which("c++")):
        pytest.skip("no C++ compiler for inductor")
    monkeypatch.setenv("WSLM_CPU_COMPILE", "1")
    llm = LLM(str(tiny_models["llama"]), dtype="bfloat16", quantization="int4", kv_cache_memory=16 << 20,
              block_size=8, max_model_len=256)  # fmt: skip
    runner = llm.llm_engine.executor.runner
    compiled = runner.compiled
    assert runner.native is not None and compiled is not None and not compiled.single
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    llm.generate([{"prompt_token_ids": demo_tok.encode(PROMPT)}], params)
    assert compiled._thread is None  # a lone chat: nothing compiles beside it
    small = [{"prompt_token_ids": demo_tok.encode(p)} for p in ("Hi", PROMPT)]
    llm.generate(small, params)
    assert compiled._thread is None  # a small batch's decode rows run in C as well (decode_rows.MAX_ROWS)
    batch = [{"prompt_token_ids": demo_tok.encode(f"{p} {i}")} for i in range(8) for p in ("Hi", PROMPT)]
    llm.generate(batch, params)
    assert compiled._thread is not None
    assert compiled.wait(timeout=600), compiled.failed
    llm.generate(batch, params)
    assert compiled.steps >= 10  # the batch's decode steps now run the graph
    assert runner.native.steps == 22  # the lone chat's decode steps and the small batch's, not the large one's


_AVX2_CHILD = """
import sys, torch
from transformers import AutoTokenizer
from wslm.backend import LLM
from wslm.backend.quant.int4_dense import pack_block
from wslm.kernels import cpu_gemv
import test_cpu_native as t

codes, x, sz, want = torch.load(sys.argv[1])
packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.int(), 1)
block_n = pack_block(packed, codes)
print("pack block:", block_n)
assert cpu_gemv.int4_q8(), "the AVX2 build has no int8 loop"
got = cpu_gemv.int4_mv(x, packed, sz, 32, block_n=block_n)
print("int4 bits equal:", torch.equal(got, want) if want is not None else "n/a")
tok = AutoTokenizer.from_pretrained(sys.argv[2])
llm = LLM(sys.argv[2], dtype="float32", quantization="int4", kv_cache_memory=16 << 20, block_size=8,
          max_model_len=256, enforce_eager=True)
runner = llm.llm_engine.executor.runner
assert runner.native is not None
print("step errors:", *t._compare(llm, tok.encode(t.PROMPT)))
"""


def test_the_avx2_build_gives_the_same_results(tiny_models, tmp_path):
    """CPUs without AVX-512 (Intel's desktop chips, AMD's before Zen 4) run torch's AVX2 code, which packs
    int4 weights in 32-row blocks, and build our AVX2 loops: here, with torch held to AVX2 and the kernels
    built with -march=haswell, the pack is recognised, the int8 loop gives the AVX-512 one's bits, and
    the float32 step (dtype=auto's choice there) agrees with the eager one."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    with open("/proc/cpuinfo", encoding="utf-8") as f:
        if " avx2" not in f.read():
            pytest.skip("no AVX2 on this CPU")
    torch.manual_seed(0)
    n, k = 256, 576
    codes = torch.randint(0, 16, (n, k), dtype=torch.uint8)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.int(), 1)
    sz = (torch.randn(k // 32, n, 2) * 0.05).to(torch.bfloat16).contiguous()
    x = torch.randn(1, k).to(torch.bfloat16)
    from wslm.backend.quant.int4_dense import pack_block

    block_n = pack_block(packed, codes)
    want = cpu_gemv.int4_mv(x, packed, sz, 32, block_n=block_n) if cpu_gemv.int4_q8() else None
    torch.save((codes, x, sz, want), tmp_path / "case.pt")
    tests = Path(__file__).parent
    env = dict(os.environ, WSLM_CPU_KERNELS_CFLAGS="-march=haswell", XDG_CACHE_HOME=str(tmp_path / "cache"),
               ATEN_CPU_CAPABILITY="avx2", ONEDNN_MAX_CPU_ISA="AVX2",
               PYTHONPATH=os.pathsep.join([str(tests), os.environ.get("PYTHONPATH", "")]))  # fmt: skip
    done = subprocess.run([sys.executable, "-c", _AVX2_CHILD, str(tmp_path / "case.pt"), str(tiny_models["llama"])],
                          env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = dict(line.split(":", 1) for line in done.stdout.splitlines() if ":" in line)
    assert lines["pack block"].strip() == "32"
    assert lines["int4 bits equal"].strip() in ("True", "n/a")
    logit_err, kv_err = map(float, lines["step errors"].split())
    assert logit_err < 0.05 and kv_err < 0.05
    assert list((tmp_path / "cache").rglob("cpu_gemv-*.so"))  # built apart from the user's own library


_PLAIN_CHILD = """
import sys
from transformers import AutoTokenizer
from wslm.backend import LLM
from wslm.kernels import cpu_gemv
import test_cpu_native as t

assert not cpu_gemv.int4_q8(), "built with vector loops"
tok = AutoTokenizer.from_pretrained(sys.argv[1])
for dtype in ("bfloat16", "float32"):
    llm = LLM(sys.argv[1], dtype=dtype, quantization="int4", kv_cache_memory=16 << 20, block_size=8,
              max_model_len=256, enforce_eager=True)
    runner = llm.llm_engine.executor.runner
    assert runner.native is not None
    print(dtype, "step errors:", *t._compare(llm, tok.encode(t.PROMPT)))
    step = t._one_step(llm, [(i * 97) % 900 + 5 for i in range(200)])
    one, team = runner.native.run(*step, threads=1), runner.native.run(*step, threads=2)
    print(dtype, "team error:", float((team - one).abs().max() / one.abs().max()))
"""


def test_the_plain_c_build_gives_the_same_results(tiny_models, tmp_path):
    """A CPU with neither AVX2 nor AVX-512 (or a compiler that targets none) gets the kernels' plain C
    loops: built here with -march=x86-64, the C step still agrees with the eager one, alone and as a team."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    tests = Path(__file__).parent
    env = dict(os.environ, WSLM_CPU_KERNELS_CFLAGS="-march=x86-64", XDG_CACHE_HOME=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join([str(tests), os.environ.get("PYTHONPATH", "")]))  # fmt: skip
    done = subprocess.run([sys.executable, "-c", _PLAIN_CHILD, str(tiny_models["llama"])], env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    for line in done.stdout.splitlines():
        if "step errors:" in line:
            assert all(float(v) < 0.05 for v in line.split(":")[1].split())
        if "team error:" in line:
            assert float(line.split(":")[1]) < 0.02
    assert done.stdout.count("errors:") == 2 and done.stdout.count("team error:") == 2
