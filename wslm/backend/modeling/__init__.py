"""Our own model code over a flattened, variable-length batch (no HF modeling classes).

layers/ holds the building blocks (linear methods, attention, rotary, norms, activations); models/ holds
one small file per family. The registry below maps a checkpoint's HF `architectures` entry (and a GGUF's
`general.architecture`) to its class; modules are imported only when a model is built, so the model
catalog can ask what is supported without importing torch."""

from __future__ import annotations

import importlib

# HF architecture name -> (module under models/, class name).
_MODELS: dict[str, tuple[str, str]] = {
    "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),
    "MistralForCausalLM": ("llama", "MistralForCausalLM"),
    "Qwen2ForCausalLM": ("llama", "Qwen2ForCausalLM"),
    "Qwen3ForCausalLM": ("qwen3", "Qwen3ForCausalLM"),
    "Qwen3MoeForCausalLM": ("qwen3_moe", "Qwen3MoeForCausalLM"),
    "Qwen2MoeForCausalLM": ("qwen3_moe", "Qwen2MoeForCausalLM"),
    "Phi3ForCausalLM": ("phi3", "Phi3ForCausalLM"),
    "Gemma2ForCausalLM": ("gemma3", "Gemma2ForCausalLM"),
    "Gemma3ForCausalLM": ("gemma3", "Gemma3ForCausalLM"),
    "Gemma3ForConditionalGeneration": ("gemma3_vl", "Gemma3ForConditionalGeneration"),
    "GptOssForCausalLM": ("gpt_oss", "GptOssForCausalLM"),
    "LlavaForConditionalGeneration": ("llava", "LlavaForConditionalGeneration"),
    "Qwen2_5_VLForConditionalGeneration": ("qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration"),
    "Idefics3ForConditionalGeneration": ("idefics3", "Idefics3ForConditionalGeneration"),
}

# Kept under its old name: the model catalog and the loader test membership and list the keys.
SUPPORTED_ARCHITECTURES: dict[str, tuple[str, str]] = _MODELS

# GGUF general.architecture -> HF architecture (the families transformers' GGUF loader can read).
GGUF_ARCHITECTURES: dict[str, str] = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
    "qwen3moe": "Qwen3MoeForCausalLM",
    "qwen2moe": "Qwen2MoeForCausalLM",
}


def gguf_architecture(model_type: str) -> str:
    """The GGUF architecture name of a config that transformers read from a GGUF (qwen3_moe -> qwen3moe,
    gemma3_text -> gemma3)."""
    return model_type.removesuffix("_text").replace("_", "")


def unsupported_message(arch: str) -> str:
    names = ", ".join(SUPPORTED_ARCHITECTURES)
    return f"Model architecture {arch!r} is not supported by wslm's engine. Supported: {names}."


def get_model_class(arch: str) -> type:
    """The class that runs HF architecture `arch`; ValueError naming the supported list otherwise."""
    if arch not in _MODELS:
        raise ValueError(unsupported_message(arch))
    module, name = _MODELS[arch]
    return getattr(importlib.import_module(f"wslm.backend.modeling.models.{module}"), name)
