"""GGUF with llama.cpp's mmproj projector file (issue 35 item 2): a tiny random LLaVA-1.5 written as an HF
folder, then split as llama.cpp ships it (text GGUF + mmproj GGUF, tests/mmproj_helpers.py). The pair, with
--mmproj and found beside the model file, gives HF transformers' logits (float32) for a text + image prompt;
a projector of another family or type is refused with the cause named, and one found beside a model it does
not fit is skipped (text only)."""

from __future__ import annotations

import shutil

import pytest
from mmproj_helpers import llava_pair_files, retyped_mmproj
from vision_helpers import (
    check_top,
    data_url,
    hf_greedy_top,
    image_bytes,
    noise_image,
)

from wslm.backend.sampling_params import SamplingParams

STEPS = 4
SQUARE = noise_image(28, 28, 3)  # the tower's size: both paths only normalize it (no resampling to compare)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return llava_pair_files(tmp_path_factory.mktemp("mmproj"))


def _llm(model, tok, **kw):
    from wslm.backend.entrypoints.llm import LLM

    return LLM(str(model), tokenizer=str(tok), dtype="float32", max_model_len=256, block_size=8,
               num_gpu_blocks_override=64, enforce_eager=True, **kw)


def _params() -> SamplingParams:
    return SamplingParams(max_tokens=STEPS, temperature=0, logprobs=5, ignore_eos=True)


def _check(out, expected_ids, expected_top) -> None:
    check_top(out, expected_ids, expected_top, STEPS)


def test_gguf_with_mmproj_equals_hf(pair, monkeypatch):
    """Found beside the model file (LM Studio's layout): LLaVA's mlp projector over the Llama GGUF; image
    part first, then the question, as HF's processor expands <image> (16 tokens) and the GGUF path writes the
    media marker there. Batched with a text-only request too."""
    monkeypatch.setenv("WSLM_GGUF_CACHE", "0")
    folder, model, _, tok = pair
    llm = _llm(model, tok)
    assert llm.llm_engine.model_config.architecture == "LlavaForConditionalGeneration"
    ref = hf_greedy_top(folder, [{"role": "user", "content": [{"type": "image"}, {"type": "text",
                                                                                   "text": "What is it?"}]}],
                        [SQUARE], STEPS)
    ref_text = hf_greedy_top(folder, [{"role": "user", "content": "Just text."}], [], STEPS)
    chat = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(image_bytes(SQUARE))}},
                                         {"type": "text", "text": "What is it?"}]}]
    _check(llm.chat(chat, _params())[0], *ref)
    outs = llm.chat([chat, [{"role": "user", "content": "Just text."}]], _params())
    _check(outs[0], *ref)
    _check(outs[1], *ref_text)
    # vLLM's offline form: the media marker marks the image's place in a raw prompt (as the template
    # renders it: trim_blocks eats the newline before ASSISTANT).
    out = llm.generate({"prompt": "USER: <__media__>\nWhat is it?ASSISTANT:", "multi_modal_data": {"image": SQUARE}},
                       _params())[0]
    assert out.outputs[0].token_ids[:STEPS] == [next(iter(step)) for step in ref[1]]
    # --mmproj none: the projector beside the model is not loaded (llama.cpp's --no-mmproj).
    assert _llm(model, tok, mmproj="none").llm_engine.processor.vision is None
    # A non-square image is letterboxed to the tower's size (clip.cpp's way): still 16 image tokens.
    wide = [{"role": "user", "content": [{"type": "image_url",
                                          "image_url": {"url": data_url(image_bytes(noise_image(50, 30, 4)))}}]}]
    assert len(llm.chat(wide, _params())[0].prompt_token_ids) == len(ref[0]) - len("\nWhat is it?")


def test_explicit_mmproj_flag_and_refusals(pair, tmp_path, monkeypatch):
    """--mmproj names the file (here from another folder); a projector type wslm does not run, and one of
    another family, are refused naming the cause and what is supported; beside the model, a misfit is
    skipped with a warning and the model serves text."""
    monkeypatch.setenv("WSLM_GGUF_CACHE", "0")
    folder, model, mmproj, tok = pair
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(model, alone / model.name)
    elsewhere = shutil.copy(mmproj, tmp_path / "vision.gguf")
    llm = _llm(alone / model.name, tok, mmproj=str(elsewhere))
    assert llm.llm_engine.model_config.mmproj == str(elsewhere)

    # Unknown projector type: the same file with its type rewritten.
    odd = retyped_mmproj(mmproj, tmp_path / "mmproj-odd.gguf", "qwen2.5vl_merger")
    with pytest.raises(ValueError, match=r"'qwen2.5vl_merger'.*supported mmproj projector types: 'mlp'.*'gemma3'"):
        _llm(alone / model.name, tok, mmproj=str(odd))
    # Not an mmproj at all (the text model given as the projector).
    with pytest.raises(ValueError, match="not an mmproj file"):
        _llm(alone / model.name, tok, mmproj=str(model))
    # Beside the model, the odd one is skipped: text only, no error.
    shutil.move(odd, alone / odd.name)
    text_only = _llm(alone / model.name, tok)
    assert text_only.llm_engine.model_config.architecture == "LlamaForCausalLM"
    assert text_only.llm_engine.processor.vision is None


def test_gemma3_gguf_with_mmproj_equals_hf(tmp_path, monkeypatch):
    """Gemma 3 (6 text layers: its own every-6th-global pattern, as its GGUF reads back): the gemma3 projector
    over the Gemma 3 GGUF, image tokens bidirectional within the image. A raw prompt written as HF's processor
    expands an image (blank lines around <start_of_image> ... <end_of_image>) gives HF's logits; in chat the
    media marker takes mtmd's <start_of_image> / <end_of_image> around the image's 4 tokens."""
    from mmproj_helpers import write_gemma3_pair
    from vision_helpers import GEMMA3_TEMPLATE, gemma3_tokenizer, make_tiny_gemma3

    monkeypatch.setenv("WSLM_GGUF_CACHE", "0")
    folder = make_tiny_gemma3(tmp_path / "hf", text_layers=6)
    model, _ = write_gemma3_pair(folder, tmp_path / "gguf")
    tok = gemma3_tokenizer()
    tok.chat_template = GEMMA3_TEMPLATE
    tok.save_pretrained(tmp_path / "tok")
    llm = _llm(model, tmp_path / "tok")
    assert llm.llm_engine.model_config.architecture == "Gemma3ForConditionalGeneration"
    hf_messages = [{"role": "user", "content": [{"type": "text", "text": "Look:"}, {"type": "image"},
                                                {"type": "text", "text": "What is it?"}]}]
    ids, top = hf_greedy_top(folder, hf_messages, [SQUARE], STEPS)
    raw = "<bos><start_of_turn>user\nLook:\n\n<__media__>\n\nWhat is it?<end_of_turn>\n<start_of_turn>model\n"
    _check(llm.generate({"prompt": raw, "multi_modal_data": {"image": SQUARE}}, _params())[0], ids, top)
    chat = [{"role": "user", "content": [{"type": "text", "text": "Look:"},
                                         {"type": "image_url", "image_url": {"url": data_url(image_bytes(SQUARE))}},
                                         {"type": "text", "text": "What is it?"}]}]
    got = llm.chat(chat, _params())[0].prompt_token_ids
    start, end, soft = (tok.convert_tokens_to_ids(t) for t in ("<start_of_image>", "<end_of_image>",
                                                                "<image_soft_token>"))
    i = got.index(start)
    assert got[i + 1 : i + 6] == [soft] * 4 + [end]


def test_models_list_shows_the_pair_as_one_vision_model(pair, tmp_path, monkeypatch, capsys):
    """LM Studio's layout under the models folder: the mmproj is not a model of its own; the model beside it
    is listed with it (`mmproj` in the JSON, ARCH "+vision" in the table)."""
    from wslm.backend.hub.catalog import list_models
    from wslm.cli import build_parser

    _, model, mmproj, _ = pair
    for var in ("HF_TOKEN", "HF_ENDPOINT", "HF_HUB_OFFLINE", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("WSLM_MODELS_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("WSLM_CONFIG_DIR", str(tmp_path / "config"))
    folder = tmp_path / "models" / "lmstudio" / "tiny-llava"
    folder.mkdir(parents=True)
    shutil.copy(model, folder / model.name)
    shutil.copy(mmproj, folder / mmproj.name)
    listed = {m.id: m for m in list_models() if m.source == "models-dir"}
    assert list(listed) == [f"lmstudio/tiny-llava/{model.name}"]
    assert listed[f"lmstudio/tiny-llava/{model.name}"].mmproj == str(folder / mmproj.name)
    args = build_parser().parse_args(["models", "list"])
    args.func(args)
    assert "Llama+vision" in capsys.readouterr().out
