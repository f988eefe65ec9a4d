"""Images in chat (issue 35 item 2) on the engine: a tiny random LLaVA-1.5 written by the test gives HF
transformers' logits (float32) for text + image prompts, alone and batched with a text-only request; two
images behind the same placeholder ids never share prefix-cache blocks, the same image does."""

from __future__ import annotations

import pytest
from vision_helpers import check_top, data_url, hf_greedy_top, image_bytes, make_tiny_llava, noise_image

from wslm.backend.sampling_params import SamplingParams

STEPS = 4


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_tiny_llava(tmp_path_factory.mktemp("llava"))


@pytest.fixture(scope="module")
def llm(folder):
    from wslm.backend.entrypoints.llm import LLM

    return LLM(str(folder), dtype="float32", max_model_len=256, block_size=8, num_gpu_blocks_override=128,
               enforce_eager=True)


IMG_A, IMG_B = noise_image(40, 50, 0), noise_image(33, 29, 1)


def _chat(img, question: str = "What is it?") -> list[dict]:
    content = [{"type": "text", "text": question}]
    if img is not None:
        content.insert(0, {"type": "image_url", "image_url": {"url": data_url(image_bytes(img))}})
    return [{"role": "user", "content": content}]


def _hf(folder, img, question: str = "What is it?"):
    content = [{"type": "text", "text": question}]
    if img is not None:
        content.insert(0, {"type": "image"})
    return hf_greedy_top(folder, [{"role": "user", "content": content}], [img] if img is not None else [], STEPS)


def _check(out, expected_ids, expected_top) -> None:
    check_top(out, expected_ids, expected_top, STEPS)


def _params() -> SamplingParams:
    return SamplingParams(max_tokens=STEPS, temperature=0, logprobs=5, ignore_eos=True)


def test_logits_equal_hf_alone_batched_and_never_shared_across_images(llm, folder):
    ref_a, ref_b, ref_text = _hf(folder, IMG_A), _hf(folder, IMG_B), _hf(folder, None, "Just text here.")
    # Image A alone, then image B alone: B's first blocks hold the same placeholder ids as A's cached ones,
    # and must not be taken from the cache.
    out_a = llm.chat(_chat(IMG_A), _params())[0]
    _check(out_a, *ref_a)
    out_b = llm.chat(_chat(IMG_B), _params())[0]
    _check(out_b, *ref_b)
    first_image_token = ref_b[0].index(258)
    assert out_b.num_cached_tokens <= first_image_token
    # The same image again: its blocks come from the cache, and the answer is the same.
    again = llm.chat(_chat(IMG_B), _params())[0]
    _check(again, *ref_b)
    assert again.num_cached_tokens >= 16
    # Batched: both images and a text-only request in one step.
    outs = llm.chat([_chat(IMG_A, "Other question?"), _chat(None, "Just text here."), _chat(IMG_B, "Third one")],
                    _params())
    _check(outs[0], *_hf(folder, IMG_A, "Other question?"))
    _check(outs[1], *ref_text)
    _check(outs[2], *_hf(folder, IMG_B, "Third one"))


def test_vllm_offline_multi_modal_data_prompt(llm, folder):
    """vLLM's LLM.generate form: {"prompt": text with <image>, "multi_modal_data": {"image": PIL image}}."""
    ids, top = _hf(folder, IMG_A)
    text = "USER: <image>\nWhat is it?ASSISTANT:"  # the template as rendered (trim_blocks eats a newline)
    out = llm.generate({"prompt": text, "multi_modal_data": {"image": IMG_A}}, _params())[0]
    assert out.outputs[0].token_ids[:STEPS] == [next(iter(step)) for step in top]
    with pytest.raises(ValueError, match="image placeholder token"):
        llm.generate({"prompt": text}, _params())


def test_images_split_by_chunked_prefill_match_hf(folder):
    """A prompt whose image tokens fall in two prefill chunks (a step budget of 12 tokens): the image is
    encoded once and each chunk takes its share of the embeddings."""
    from wslm.backend.entrypoints.llm import LLM

    small = LLM(str(folder), dtype="float32", max_model_len=256, block_size=8, num_gpu_blocks_override=64,
                enforce_eager=True, max_num_batched_tokens=12, enable_prefix_caching=False)
    _check(small.chat(_chat(IMG_B), _params())[0], *_hf(folder, IMG_B))


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    from vision_helpers import make_tiny_gemma3

    from wslm.backend.entrypoints.llm import LLM

    folder = make_tiny_gemma3(tmp_path_factory.mktemp("gemma3"))
    return folder, LLM(str(folder), dtype="float32", max_model_len=256, block_size=8, num_gpu_blocks_override=128,
                       enforce_eager=True)


def _gemma_chat(img, question: str) -> tuple[list[dict], list[dict]]:
    """(the request's messages, HF's): text, the image, text; a sliding window of 8 cuts through the image."""
    ours = [{"type": "text", "text": "Look:"}, {"type": "text", "text": question}]
    hf = [dict(p) for p in ours]
    if img is not None:
        ours.insert(1, {"type": "image_url", "image_url": {"url": data_url(image_bytes(img))}})
        hf.insert(1, {"type": "image"})
    return [{"role": "user", "content": ours}], [{"role": "user", "content": hf}]


def test_gemma3_logits_equal_hf_with_bidirectional_image_attention(gemma3):
    """Gemma 3: SigLIP tower, pooled projector, and image tokens that see their whole image (HF masks them so;
    causal attention would differ from HF by ~0.06 in logprob here)."""
    folder, llm = gemma3
    cases = [(IMG_A, "What is it?"), (None, "Just text."), (IMG_B, "And this?")]
    refs = []
    for img, question in cases:
        _, hf_messages = _gemma_chat(img, question)
        refs.append(hf_greedy_top(folder, hf_messages, [img] if img is not None else [], STEPS))
    _check(llm.chat(_gemma_chat(IMG_A, "What is it?")[0], _params())[0], *refs[0])
    outs = llm.chat([_gemma_chat(img, q)[0] for img, q in cases], _params())
    for out, ref in zip(outs, refs):
        _check(out, *ref)
    # A 16-token step budget would end the first chunk inside the image (tokens 15-18): the scheduler ends it
    # where the image begins, so the image's tokens still see each other.
    from wslm.backend.entrypoints.llm import LLM

    chunked = LLM(str(folder), dtype="float32", max_model_len=256, block_size=8, num_gpu_blocks_override=64,
                  enforce_eager=True, max_num_batched_tokens=16, enable_prefix_caching=False)
    _check(chunked.chat(_gemma_chat(IMG_A, "What is it?")[0], _params())[0], *refs[0])


def test_tensor_parallel_two_ranks_match_hf(gemma3):
    """Two CPU ranks (mp executor): the step's images travel to both workers, each runs the (replicated)
    vision tower and its own heads' bidirectional image rows; Gemma 3 still equals HF (LLaVA's path is the
    same minus the image rows)."""
    from wslm.backend.entrypoints.llm import LLM

    folder, _ = gemma3
    messages, hf_messages = _gemma_chat(IMG_A, "What is it?")
    llm = LLM(str(folder), tensor_parallel_size=2, dtype="float32", max_model_len=256, block_size=8,
              num_gpu_blocks_override=64)
    try:
        _check(llm.chat(messages, _params())[0], *hf_greedy_top(folder, hf_messages, [IMG_A], STEPS))
    finally:
        llm.llm_engine.shutdown()
