"""AWQ (GEMM) and GPTQ (with and without act-order) checkpoints made here from a tiny random Llama load
kept in int4 and match the same engine running their dequantized weights densely."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from wslm.backend import LLM, SamplingParams

GROUP = 32
_AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _quantize(w: torch.Tensor, g_idx: torch.Tensor):
    """Asymmetric 4-bit per group of input columns: integer q, z and scales s, [K, N] / [G, N] layout."""
    wt = w.t().float()  # [K, N]
    groups = int(g_idx.max()) + 1
    lo = torch.stack([wt[g_idx == g].amin(0) for g in range(groups)])
    hi = torch.stack([wt[g_idx == g].amax(0) for g in range(groups)])
    s = ((hi - lo) / 15).clamp(min=1e-6).half().float()
    z = torch.round(-lo / s).clamp(0, 15)
    q = torch.round(wt / s[g_idx] + z[g_idx]).clamp(0, 15).to(torch.int32)
    deq = ((q.float() - z[g_idx]) * s[g_idx]).t()  # [N, K], the reference
    return q, z.to(torch.int32), s.half(), deq


def _pack_cols(v: torch.Tensor, order) -> torch.Tensor:
    r, c = v.shape
    v = v.reshape(r, c // 8, 8)
    out = torch.zeros(r, c // 8, dtype=torch.int32)
    for i, col in enumerate(order):
        out |= v[:, :, col] << (4 * i)
    return out


def _make_checkpoint(src, dst, method: str, act_order: bool = False) -> dict[str, torch.Tensor]:
    shutil.copytree(src, dst)
    state = load_file(str(dst / "model.safetensors"))
    reference = {}
    out = {}
    gen = torch.Generator().manual_seed(7)
    for name, w in state.items():
        module = name.removesuffix(".weight")
        if not any(f".{p}." in name for p in LINEARS):
            out[name] = w
            continue
        k = w.shape[1]
        g_idx = torch.arange(k) // GROUP
        if act_order:
            g_idx = g_idx[torch.randperm(k, generator=gen)]
        q, z, s, deq = _quantize(w, g_idx)
        reference[name] = deq
        if method == "awq":
            out[module + ".qweight"] = _pack_cols(q, _AWQ_ORDER)
            out[module + ".qzeros"] = _pack_cols(z, _AWQ_ORDER)
        else:  # GPTQ: qweight packed along K, zeros stored minus one
            out[module + ".qweight"] = _pack_cols(q.t().contiguous(), range(8)).t().contiguous()
            out[module + ".qzeros"] = _pack_cols(z - 1, range(8))
            out[module + ".g_idx"] = g_idx.to(torch.int32)
        out[module + ".scales"] = s
    save_file(out, str(dst / "model.safetensors"))
    cfg = json.loads((dst / "config.json").read_text())
    cfg["quantization_config"] = (
        {"quant_method": "awq", "bits": 4, "group_size": GROUP, "zero_point": True, "version": "gemm"}
        if method == "awq"
        else {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": act_order, "sym": False}
    )
    (dst / "config.json").write_text(json.dumps(cfg))
    return reference


@pytest.mark.parametrize("method, act_order", [("awq", False), ("gptq", False), ("gptq", True)])
def test_awq_gptq_checkpoints_match_their_dequantized_forward(tiny_models, tmp_path, method, act_order):
    from wslm.backend.quant.int4 import Int4Weight

    folder = tmp_path / method
    reference = _make_checkpoint(tiny_models["llama"], folder, method, act_order)
    quant = LLM(str(folder), dtype="float32", kv_cache_memory=16 << 20, max_model_len=256)
    assert quant.llm_engine.model_config.quantization == method
    qmodel = quant.llm_engine.executor.runner.model
    attn, mlp = qmodel.layers[0].self_attn, qmodel.layers[0].mlp
    assert isinstance(attn.o_proj.weight, Int4Weight) and isinstance(mlp.down_proj.weight, Int4Weight)
    if not act_order:
        assert isinstance(attn.qkv_proj.weight, Int4Weight) and isinstance(mlp.gate_up_proj.weight, Int4Weight)
    # Each repacked weight is the checkpoint's own dequantization (scales rounded to bf16 at most).
    o_ref = reference["model.layers.0.self_attn.o_proj.weight"]
    o = attn.o_proj.weight.dequantize()
    torch.testing.assert_close(o, o_ref, atol=0.02 * o_ref.abs().max().item(), rtol=0)

    dense = LLM(str(tiny_models["llama"]), dtype="float32", kv_cache_memory=16 << 20, max_model_len=256)
    dmodel = dense.llm_engine.executor.runner.model
    for i, dlayer in enumerate(dmodel.layers):
        p = f"model.layers.{i}."
        r = {n: reference[p + n + ".weight"] for n in [f"self_attn.{x}" for x in LINEARS[:4]]}
        r.update({n: reference[p + n + ".weight"] for n in [f"mlp.{x}" for x in LINEARS[4:]]})
        attn, mlp = dlayer.self_attn, dlayer.mlp
        attn.qkv_proj.weight = torch.cat([r["self_attn.q_proj"], r["self_attn.k_proj"], r["self_attn.v_proj"]])
        attn.o_proj.weight = r["self_attn.o_proj"]
        mlp.gate_up_proj.weight = torch.cat([r["mlp.gate_proj"], r["mlp.up_proj"]])
        mlp.down_proj.weight = r["mlp.down_proj"]
    dense.llm_engine.executor.runner.weights_updated()
    prompt = dense.get_tokenizer().encode("The quick brown fox jumps over the lazy dog")
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    ref = list(dense.generate([{"prompt_token_ids": prompt}], params)[0].outputs[0].token_ids)
    one = SamplingParams(temperature=0, max_tokens=1)
    got = [
        quant.generate([{"prompt_token_ids": prompt + ref[:i]}], one)[0].outputs[0].token_ids[0]
        for i in range(24)
    ]
    assert sum(a == b for a, b in zip(got, ref)) / len(ref) >= 0.9


def test_catalog_offers_4bit_awq_gptq_and_the_loader_names_other_widths(tiny_models, tmp_path):
    """`wslm models list` marks 4-bit AWQ/GPTQ runnable; an 8-bit GPTQ or a GEMV-packed AWQ is refused by name
    (they would otherwise be repacked as 4-bit GEMM and load as noise)."""
    from wslm.backend.hub.catalog import _prequantized_support
    from wslm.backend.hub.metadata import ModelMetadata
    from wslm.backend.loader.model_loader import check_prequantized

    def why(**q):  # the format's own answer (QuantMethod.unsupported), as `wslm models list` shows it
        return _prequantized_support(ModelMetadata(quantization="x", quant_config=q))

    assert why(quant_method="awq", bits=4) is None and why(quant_method="gptq", bits=4) is None
    assert why(quant_method="gptq") is None and "8-bit weights" in why(quant_method="gptq", bits=8)
    assert "no weight format reads it" in why(quant_method="bitsandbytes", bits=4)
    check_prequantized("awq", {"bits": 4, "version": "GEMM"})
    with pytest.raises(ValueError, match="8-bit weights; wslm runs 4-bit AWQ/GPTQ only"):
        check_prequantized("gptq", {"bits": 8})
    with pytest.raises(ValueError, match="packed as 'gemv'"):
        check_prequantized("awq", {"w_bit": 4, "version": "gemv"})
    folder = tmp_path / "gptq8"
    _make_checkpoint(tiny_models["llama"], folder, "gptq")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"]["bits"] = 8
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="8-bit"):
        LLM(str(folder), dtype="float32", kv_cache_memory=16 << 20, max_model_len=256)
