"""SmolVLM (Idefics3) from an HF folder (issue 35 item 2, the small family): a tiny random checkpoint written by
the test gives HF transformers' top-5 logprobs (float32) for a chat with an image cut into tiles (2x2 tiles and
the global image: 5 runs of 4 placeholder tokens between row/column markers), alone and batched with another
image and a text-only request; the same model as llama.cpp splits it (Llama GGUF + idefics3 mmproj) too."""

from __future__ import annotations

import pytest
from vision_helpers import check_top, data_url, hf_greedy_top, image_bytes, make_tiny_smolvlm, noise_image

from wslm.backend.sampling_params import SamplingParams

STEPS = 4
IMG_A, IMG_B = noise_image(40, 50, 0), noise_image(20, 20, 1)  # 2x2 tiles + global; one tile + global


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_tiny_smolvlm(tmp_path_factory.mktemp("smolvlm"))


def _chat(img, question: str):
    ours, hf = [{"type": "text", "text": question}], [{"type": "text", "text": question}]
    if img is not None:
        ours.insert(0, {"type": "image_url", "image_url": {"url": data_url(image_bytes(img))}})
        hf.insert(0, {"type": "image"})
    return [{"role": "user", "content": ours}], [{"role": "user", "content": hf}]


def _check(out, expected_ids, expected_top) -> None:
    check_top(out, expected_ids, expected_top, STEPS)


def test_smolvlm_tiles_equal_hf(folder):
    from wslm.backend.entrypoints.llm import LLM

    llm = LLM(str(folder), dtype="float32", max_model_len=256, block_size=8, num_gpu_blocks_override=96,
              enforce_eager=True)
    assert llm.llm_engine.model_config.architecture == "Idefics3ForConditionalGeneration"
    cases = [(IMG_A, "What is it?"), (None, "Just text."), (IMG_B, "And this?")]
    refs = [hf_greedy_top(folder, _chat(img, q)[1], [img] if img is not None else [], STEPS) for img, q in cases]
    assert refs[0][0].count(259) == 20  # <image>: 4 tiles and the global image, 4 tokens each
    params = SamplingParams(max_tokens=STEPS, temperature=0, logprobs=5, ignore_eos=True)
    _check(llm.chat(_chat(*cases[0])[0], params)[0], *refs[0])
    for out, ref in zip(llm.chat([_chat(img, q)[0] for img, q in cases], params), refs):
        _check(out, *ref)


def test_smolvlm_gguf_with_mmproj_equals_hf(folder, tmp_path, monkeypatch):
    """The same tiny SmolVLM as llama.cpp splits it (Llama GGUF + idefics3 mmproj): a raw prompt with the media
    marker where SmolVLM's template puts <image> gives the tiles' prompt and HF's logits."""
    from mmproj_helpers import write_smolvlm_pair

    from wslm.backend.entrypoints.llm import LLM

    monkeypatch.setenv("WSLM_GGUF_CACHE", "0")
    model, _ = write_smolvlm_pair(folder, tmp_path / "gguf")
    llm = LLM(str(model), tokenizer=str(folder), dtype="float32", max_model_len=256, block_size=8,
              num_gpu_blocks_override=96, enforce_eager=True)
    assert llm.llm_engine.model_config.architecture == "Idefics3ForConditionalGeneration"
    ids, top = hf_greedy_top(folder, _chat(IMG_A, "What is it?")[1], [IMG_A], STEPS)
    raw = "<|im_start|>User:<__media__>What is it?<end_of_utterance>\nAssistant:"
    params = SamplingParams(max_tokens=STEPS, temperature=0, logprobs=5, ignore_eos=True)
    _check(llm.generate({"prompt": raw, "multi_modal_data": {"image": IMG_A}}, params)[0], ids, top)
