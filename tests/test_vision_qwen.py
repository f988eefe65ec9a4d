"""Qwen2.5-VL (issue 35 item 2) on the engine: a tiny random checkpoint written by the test gives HF
transformers' greedy `generate` (float32): the same prompt ids (the processor's dynamic resolution), the same
top-5 logprobs at every step, alone and batched with a text-only prompt and a two-image prompt. Decode steps
check the M-RoPE positions (each token's index + the sequence's delta, through the CPU decode plan), a prompt
cut by chunked prefill inside an image checks an image's grid positions across steps (--mm-processor-kwargs
sizing the image), and a repeated image
hits the prefix cache while another image behind the same placeholder ids does not; n-gram speculation's
verification rows take the delta too."""

from __future__ import annotations

import pytest
from qwen_vl_helpers import hf_generate_top, make_tiny_qwen25vl
from vision_helpers import data_url, image_bytes, noise_image

from wslm.backend.sampling_params import SamplingParams

STEPS = 6
IMG_A, IMG_B, IMG_C = noise_image(40, 50, 0), noise_image(33, 29, 1), noise_image(64, 24, 2)
BIG = noise_image(300, 200, 3)  # above the processor's max_pixels (48 x 48): resized down


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_tiny_qwen25vl(tmp_path_factory.mktemp("qwen25vl"))


@pytest.fixture(scope="module")
def llm(folder):
    from wslm.backend.entrypoints.llm import LLM

    return LLM(str(folder), dtype="float32", max_model_len=256, block_size=8, num_gpu_blocks_override=128,
               enforce_eager=True, max_image_pixels=100_000)


def _messages(parts: list) -> tuple[list[dict], list[dict], list]:
    """(our request's messages, HF's, HF's images) for parts: str (text) or a PIL image."""
    ours, theirs, images = [], [], []
    for part in parts:
        if isinstance(part, str):
            ours.append({"type": "text", "text": part})
            theirs.append({"type": "text", "text": part})
        else:
            ours.append({"type": "image_url", "image_url": {"url": data_url(image_bytes(part))}})
            theirs.append({"type": "image"})
            images.append(part)
    return [{"role": "user", "content": ours}], [{"role": "user", "content": theirs}], images


def _hf(folder, parts: list, steps: int = STEPS, **kw):
    _, theirs, images = _messages(parts)
    return hf_generate_top(folder, theirs, images, steps, **kw)


def _check(out, expected_ids, expected_top) -> None:
    assert list(out.prompt_token_ids) == expected_ids
    got = out.outputs[0]
    assert got.token_ids == [next(iter(step)) for step in expected_top]
    for ours, theirs in zip(got.logprobs, expected_top):
        for token, logprob in theirs.items():
            assert ours[token].logprob == pytest.approx(logprob, abs=2e-4)


def _params(steps: int = STEPS) -> SamplingParams:
    return SamplingParams(max_tokens=steps, temperature=0, logprobs=5, ignore_eos=True)


def test_logits_and_decode_equal_hf_alone_and_batched(llm, folder, monkeypatch):
    # M-RoPE decode steps are plain rope at shifted positions: the CPU decode plan runs them (counted here).
    plan = llm.llm_engine.executor.runner.cpu_plan
    served = []
    run = plan.run
    monkeypatch.setattr(plan, "run", lambda *a: served.append(run(*a)) or served[-1])
    image_a = ["Look", IMG_A, "What is it?"]
    ref_a = _hf(folder, image_a)
    assert ref_a[0].count(261) == 30  # 40 x 50 px -> 48 x 40 (multiples of 8) -> a 6 x 5 token grid
    _check(llm.chat(_messages(image_a)[0], _params())[0], *ref_a)
    # Batched: the image prompt, a text-only one, two images of other shapes with text between them.
    cases = [image_a, ["Just text here."], ["First", IMG_B, "then", IMG_C, "which?"]]
    refs = [ref_a] + [_hf(folder, parts) for parts in cases[1:]]
    outs = llm.chat([_messages(parts)[0] for parts in cases], _params())
    for out, ref in zip(outs, refs):
        _check(out, *ref)
    assert sum(logits is not None for logits in served) >= 2 * (STEPS - 1)


def test_prefix_cache_keys_on_the_image(llm, folder):
    """Image A then image B behind the same placeholder ids (one size): B takes no cached image blocks; B again
    takes them, and the text after the image (positions shifted by the cached image's grid) still equals HF."""
    other = noise_image(40, 50, 7)
    ref_b = _hf(folder, ["Look", other, "What is it?"])
    llm.chat(_messages(["Look", IMG_A, "What is it?"])[0], _params())
    out_b = llm.chat(_messages(["Look", other, "What is it?"])[0], _params())[0]
    _check(out_b, *ref_b)
    assert out_b.num_cached_tokens <= ref_b[0].index(261)
    again = llm.chat(_messages(["Look", other, "What is it?"])[0], _params())[0]
    _check(again, *ref_b)
    assert again.num_cached_tokens >= 32


def test_large_image_is_resized_by_the_processor(llm, folder):
    """Dynamic resolution: a 300 x 200 image is resized under the processor's max_pixels (48 x 48) keeping its
    shape: 56 x 32 px, a 4 x 7 token grid. An image over --max-image-pixels (100,000 here) is refused first."""
    ref = _hf(folder, [BIG, "Big?"])
    assert ref[0].count(261) == 28
    _check(llm.chat(_messages([BIG, "Big?"])[0], _params())[0], *ref)
    with pytest.raises(ValueError, match="--max-image-pixels"):
        llm.chat(_messages([noise_image(400, 300, 4), "Huge?"])[0], _params())


def test_chunked_prefill_speculation_and_processor_kwargs_match_hf(folder):
    """--mm-processor-kwargs '{"max_pixels": 1024}': the image is resized to 32 x 24 px, a 4 x 3 token grid (as
    HF's processor with the same setting). An 8-token step budget computes its 12 tokens in two steps (8 + 4),
    the second chunk's image tokens taking their grid positions from where it starts in the image. With n-gram
    speculation the verification rows (one per draft) take the sequence's M-RoPE delta too."""
    from wslm.backend.entrypoints.llm import LLM

    small = LLM(str(folder), dtype="float32", max_model_len=256, block_size=8, num_gpu_blocks_override=64,
                enforce_eager=True, max_num_batched_tokens=8, enable_prefix_caching=False,
                mm_processor_kwargs='{"max_pixels": 1024}',
                speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2,
                                    "prompt_lookup_min": 1})
    parts = ["Look", IMG_A, "What is it? aaaa bbbb aaaa bbbb"]
    ref = _hf(folder, parts, 16, processor_kwargs={"max_pixels": 1024})
    assert ref[0].count(261) == 12
    _check(small.chat(_messages(parts)[0], _params(16))[0], *ref)
    assert small.llm_engine.get_stats()["spec_decode_num_drafts"] >= 1


def test_bad_mm_processor_kwargs_name_the_flag():
    from wslm.backend.frontend.hf_processor import processor_overrides

    assert processor_overrides('{"max_pixels": 1024}') == {"max_pixels": 1024}
    for bad in ("{max_pixels: 1}", "[1]"):
        with pytest.raises(ValueError, match="--mm-processor-kwargs"):
            processor_overrides(bad)
