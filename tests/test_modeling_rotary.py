"""Rotary tables for every rope_type we read from configs, against HF's own rope init functions."""

from __future__ import annotations

import pytest
import torch

from wslm.backend.modeling.config import rope_parameters, rope_settings
from wslm.backend.modeling.layers.rotary import build_cos_sin_cache

HEAD_DIM = 32
CASES = {
    "linear": {"rope_type": "linear", "factor": 2.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    "yarn-mscale": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "mscale": 0.7,
                    "mscale_all_dim": 1.0, "beta_fast": 16, "beta_slow": 2},
    "longrope": {"rope_type": "longrope", "original_max_position_embeddings": 64,
                 "short_factor": [1.0 + i / 8 for i in range(HEAD_DIM // 2)],
                 "long_factor": [2.0 + i / 4 for i in range(HEAD_DIM // 2)]},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_cos_sin_table_matches_hf(case):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = {**CASES[case], "rope_theta": 10000.0}
    max_pos = 256
    config = LlamaConfig(hidden_size=HEAD_DIM * 2, num_attention_heads=2, max_position_embeddings=max_pos,
                         rope_parameters=params)  # fmt: skip
    theta, scaling = rope_settings(rope_parameters(config), config)
    ours = build_cos_sin_cache(HEAD_DIM, max_pos, theta, scaling, max_pos)
    rope_type = params["rope_type"]
    init = ROPE_INIT_FUNCTIONS.get(rope_type) if rope_type != "default" else None
    inv_freq, attention = init(config, "cpu") if init else (None, 1.0)
    # Positions HF rotates with this table: longrope's short factors and dynamic's unscaled frequencies
    # hold inside the original context (past it HF switches the whole sequence, we switch by position).
    upto = 64 if rope_type == "longrope" else max_pos
    pos = torch.arange(upto, dtype=torch.float32)
    freqs = torch.outer(pos, inv_freq.float())
    expected = torch.cat([freqs.cos() * attention, freqs.sin() * attention], dim=-1)
    torch.testing.assert_close(ours[:upto], expected, atol=2e-4, rtol=0)
