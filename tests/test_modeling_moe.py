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


def make_moe_model(folder, family: str, tok, seed: int = 0):
    """8 experts, top-2, 2 layers, GQA with 3 query heads per KV head; saved with the demo tokenizer."""
    import transformers as tf

    torch.manual_seed(seed)
    common = dict(
        vocab_size=len(tok), hidden_size=48, intermediate_size=64, moe_intermediate_size=32, num_experts=8,
        num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=3, num_key_value_heads=1,
        max_position_embeddings=512, initializer_range=0.2, tie_word_embeddings=False,
        eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id, pad_token_id=tok.eos_token_id,
    )  # fmt: skip
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
