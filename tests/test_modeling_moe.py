"""Qwen3-MoE and Qwen2-MoE as tiny random-weight checkpoints made here from their HF config classes (8
experts, top-2, 2 layers): greedy output token-identical to HF transformers' generate in float32 alone,
inside a batch of mixed-length prompts, on a prefix-cache hit, and with preemption forced by a tiny KV
pool."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import demo_tokenizer, hf_greedy

from wslm.backend import LLM, SamplingParams
from wslm.backend.modeling import SUPPORTED_ARCHITECTURES

MAX_TOKENS = 12
TEXTS = [
    "Hi",
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time, in a village by the sea, there lived an old clockmaker who fixed every clock "
    "in town except his own",
]  # fmt: skip


@pytest.fixture(scope="module")
def tok():
    return demo_tokenizer()


def make_moe_model(folder, family: str, tok, seed: int = 0, **sizes):
    """8 experts, top-2, 2 layers, GQA with 3 query heads per KV head; saved with the demo tokenizer.
    sizes: config fields to override (hidden_size=64 and 4 heads: every width divides into 4-bit groups)."""
    import transformers as tf

    torch.manual_seed(seed)
    common = dict(
        vocab_size=len(tok), hidden_size=48, intermediate_size=64, moe_intermediate_size=32, num_experts=8,
        num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=3, num_key_value_heads=1,
        max_position_embeddings=512, initializer_range=0.2, tie_word_embeddings=False,
        eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id, pad_token_id=tok.eos_token_id,
    )  # fmt: skip
    common.update(sizes)
    if family == "qwen3_moe":
        config = tf.Qwen3MoeConfig(head_dim=16, norm_topk_prob=True, **common)
        model = tf.Qwen3MoeForCausalLM(config)
    else:
        config = tf.Qwen2MoeConfig(shared_expert_intermediate_size=40, norm_topk_prob=False, **common)
        model = tf.Qwen2MoeForCausalLM(config)
    with torch.no_grad():  # random norms (HF starts them at one) so a wrong norm shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.3)
    model.eval()
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder, model


def _tokens(llm, prompts: list[list[int]]) -> list[list[int]]:
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts], SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    )
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen2_moe"])
def test_moe_matches_hf_alone_batched_cached_and_preempted(family, tok, tmp_path):
    assert {"Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM"} <= set(SUPPORTED_ARCHITECTURES)
    folder, hf = make_moe_model(tmp_path / family, family, tok)
    prompts = [tok.encode(t) for t in TEXTS]
    longer = prompts[-1] + tok.encode(", nor the one on the church tower")
    expected = [hf_greedy(hf, tok, p, MAX_TOKENS) for p in [*prompts, longer]]

    llm = LLM(str(folder), kv_cache_memory=16 << 20, block_size=8, dtype="float32")
    assert _tokens(llm, [prompts[-1]]) == [expected[-2]]  # alone
    assert _tokens(llm, prompts) == expected[:-1]  # in a batch of mixed lengths
    hit = llm.generate({"prompt_token_ids": longer}, SamplingParams(temperature=0, max_tokens=MAX_TOKENS))[0]
    assert hit.num_cached_tokens >= 16  # the long prompt's full blocks came from the prefix cache
    assert hit.outputs[0].token_ids == expected[-1]

    # 10 blocks of 8 tokens cannot hold the four sequences at once: preemption must happen.
    tight = LLM(str(folder), num_gpu_blocks_override=10, block_size=8, max_num_batched_tokens=32,
                max_model_len=80, dtype="float32")  # fmt: skip
    assert _tokens(tight, [*prompts, longer]) == expected
    engine = tight.llm_engine
    assert engine.scheduler.num_preemptions > 0
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def _stacked_experts(folder) -> list[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors with each layer's experts stacked per projection, as llama.cpp stores them."""
    import re
    from collections import defaultdict

    from safetensors.torch import load_file

    out: list[tuple[str, torch.Tensor]] = []
    experts: dict[str, dict[int, torch.Tensor]] = defaultdict(dict)
    for name, t in load_file(str(folder / "model.safetensors")).items():
        m = re.fullmatch(r"(.+\.mlp\.experts)\.(\d+)\.(\w+)\.weight", name)
        if m:
            experts[f"{m.group(1)}.{m.group(3)}.weight"][int(m.group(2))] = t
        else:
            out.append((name, t))
    out += [(name, torch.stack([by_e[e] for e in sorted(by_e)])) for name, by_e in experts.items()]
    return out


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen2_moe"])
def test_moe_gguf_written_here_loads_to_the_same_tokens(family, tok, tmp_path, monkeypatch):
    """Experts stacked in one tensor per projection (llama.cpp's layout), the router, Qwen2-MoE's shared expert
    and its gate; the expert width and top-k renormalisation come from the file's keys (gguf_config.py)."""
    from gguf_writer import write_gguf

    monkeypatch.setenv("WSLM_GGUF_CACHE", "0")
    folder, hf = make_moe_model(tmp_path / family, family, tok)
    path = tmp_path / f"tiny-{family}-F32.gguf"
    tensors = _stacked_experts(folder)
    write_gguf(path, hf, family.replace("_", ""), tensors=tensors)
    # `wslm models list` counts the experts at their stored type (kept as they are: F32 here).
    from wslm.backend.hub.metadata import _read_gguf_uncached

    assert _read_gguf_uncached(path).elements_by_type == {"F32": sum(t.numel() for _, t in tensors)}
    prompts = [tok.encode(t) for t in TEXTS]
    expected = [hf_greedy(hf, tok, p, MAX_TOKENS) for p in prompts]
    llm = LLM(str(path), tokenizer=str(folder), kv_cache_memory=16 << 20, dtype="float32")
    assert llm.llm_engine.model_config.architecture == type(hf).__name__
    assert _tokens(llm, prompts) == expected


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0"])
def test_quantized_stacked_experts_are_split_and_repacked_per_expert(qtype, tmp_path):
    import gguf
    import numpy as np

    from wslm.backend.quant.gguf_weights import _expert_slices

    rng = np.random.default_rng(0)
    stacked = rng.standard_normal((3, 4, 256), dtype=np.float32)  # [experts, rows, cols]
    kind = gguf.GGMLQuantizationType[qtype]
    w = gguf.GGUFWriter(str(tmp_path / "e.gguf"), "qwen3moe")
    w.add_tensor("blk.0.ffn_up_exps.weight", gguf.quants.quantize(stacked, kind), raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    t = gguf.GGUFReader(str(tmp_path / "e.gguf")).tensors[0]
    whole = gguf.quants.dequantize(t.data, kind).reshape(3, 4, 256)
    experts = list(_expert_slices(t))  # repacked one by one: Q4_0 to int4 codes (exact), Q8_0 to int8
    assert len(experts) == 3 and all(tuple(e.shape) == (4, 256) for e in experts)
    assert all(type(e).__name__ == ("Int4Codes" if qtype == "Q4_0" else "Int8Weight") for e in experts)
    for i, e in enumerate(experts):  # same values up to the bf16 scales (Q8_0 also requantized to int8)
        np.testing.assert_allclose(e.dequantize(torch.float32).numpy(), whole[i], rtol=0.02, atol=0.02)
    assert all(np.array_equal(e.numpy(), whole[i]) for i, e in enumerate(_expert_slices(t, dequant=True)))
    assert np.abs(whole - stacked).max() <= np.abs(stacked).max() / 8  # the weight written, within a 4-bit step


def test_gpt_oss_mxfp4_experts_dequantize_to_hf_layout():
    """The released gpt-oss checkpoints hold experts as MXFP4 `_blocks` (two e2m1 codes per byte, low nibble
    first) and `_scales` (one power-of-two exponent, bias 127, per 32 values); they load as HF's dense
    [experts, in, out] tensors."""
    from wslm.backend.modeling.models.gpt_oss import _dequantize_mxfp4

    lut = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
    g = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (2, 3, 2, 16), dtype=torch.uint8, generator=g)  # [E, out rows, groups, 16 B]
    scales = torch.randint(124, 130, (2, 3, 2), dtype=torch.uint8, generator=g)
    codes = torch.stack([blocks & 0x0F, blocks >> 4], dim=-1).reshape(2, 3, 2, 32).long()
    want = (lut[codes] * torch.exp2(scales.float() - 127)[..., None]).reshape(2, 3, 64).transpose(1, 2)
    stream = [("m.layers.0.mlp.experts.down_proj_blocks", blocks), ("m.layers.0.mlp.router.bias", torch.ones(2)),
              ("m.layers.0.mlp.experts.down_proj_scales", scales)]  # fmt: skip
    out = dict(_dequantize_mxfp4(stream, torch.float32))
    assert set(out) == {"m.layers.0.mlp.router.bias", "m.layers.0.mlp.experts.down_proj"}
    torch.testing.assert_close(out["m.layers.0.mlp.experts.down_proj"], want)


def test_gpt_oss_mxfp4_checkpoint_runs_like_hf_on_its_dequantized_experts(tok, tmp_path):
    """A gpt-oss folder as released: quantization_config mxfp4, experts as `_blocks` / `_scales`. It loads
    (dequantized) and decodes as HF does with the same dequantized experts."""
    import json

    import transformers as tf
    from safetensors.torch import load_file, save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    torch.manual_seed(0)
    config = tf.GptOssConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=16,
        max_position_embeddings=512, initializer_range=0.2, eos_token_id=tok.eos_token_id,
        bos_token_id=tok.bos_token_id,
    )  # fmt: skip
    hf = tf.GptOssForCausalLM(config).eval()
    folder = tmp_path / "gpt-oss"
    hf.save_pretrained(folder)
    tok.save_pretrained(folder)
    state = load_file(str(folder / "model.safetensors"))
    g = torch.Generator().manual_seed(1)
    for name in [n for n in state if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        experts, rows_in, cols_out = state.pop(name).shape  # HF's dense layout [E, in, out]
        blocks = torch.randint(0, 256, (experts, cols_out, rows_in // 32, 16), dtype=torch.uint8, generator=g)
        scales = torch.randint(120, 124, (experts, cols_out, rows_in // 32), dtype=torch.uint8, generator=g)
        state[name + "_blocks"], state[name + "_scales"] = blocks, scales
        with torch.no_grad():
            hf.get_parameter(name).copy_(convert_moe_packed_tensors(blocks, scales, dtype=torch.float32))
    (folder / "model.safetensors").unlink()
    save_file(state, str(folder / "model.safetensors"))
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["router", "lm_head"]}
    (folder / "config.json").write_text(json.dumps(cfg))

    prompts = [tok.encode(t) for t in TEXTS]
    expected = [hf_greedy(hf, tok, p, MAX_TOKENS) for p in prompts]
    llm = LLM(str(folder), kv_cache_memory=16 << 20, dtype="float32")
    assert _tokens(llm, prompts) == expected
