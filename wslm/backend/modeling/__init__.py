"""Our own model code over a flattened, variable-length batch (no HF modeling classes)."""

# HF architecture name -> what differs from plain Llama.
SUPPORTED_ARCHITECTURES: dict[str, dict] = {
    "LlamaForCausalLM": {"qkv_bias": False},
    "MistralForCausalLM": {"qkv_bias": False},
    "Qwen2ForCausalLM": {"qkv_bias": True},
}
# GGUF general.architecture -> HF architecture.
GGUF_ARCHITECTURES: dict[str, str] = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
}


def unsupported_message(arch: str) -> str:
    names = ", ".join(SUPPORTED_ARCHITECTURES)
    return f"Model architecture {arch!r} is not supported by wslm's engine. Supported: {names}."
