import os
import sys
from pathlib import Path

import pytest

# Qt tests run without a display.
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# Before anything loads torch: the servers the tests start compete with the test process for 2 cores.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# Without a GPU the Triton kernels run under Triton's interpreter. It must be on before the first
# `import triton` anywhere in the session, whichever test module happens to import it first.
if not (os.path.exists("/dev/nvidia0") or os.path.exists("/dev/dxg")):
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Engines would compile their CPU decode step in the background (~1 min of both cores each): tests run
# the eager paths; tests/test_cpu_compiled.py turns it on for its own engines.
os.environ.setdefault("WSLM_CPU_COMPILE", "0")
# The parity tests compare with HF transformers token for token, so the demo GGUF loads dequantized (as
# transformers loads it) unless a test asks for its native quantized weights (tests/test_quant*.py).
os.environ.setdefault("WSLM_GGUF_DEQUANTIZE", "1")
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def demo_llm():
    """One engine on the demo model for the whole session (loading takes a while on 2 cores)."""
    from wslm.backend import LLM

    # float32: the parity tests compare with HF transformers in float32, token for token.
    return LLM("demo", kv_cache_memory=256 << 20, max_model_len=2048, max_num_seqs=32, dtype="float32")


@pytest.fixture(scope="session")
def demo_hf_model():
    from transformers import AutoModelForCausalLM

    from wslm.demo import demo_model_path

    path = demo_model_path()
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name)
    return model.eval()


@pytest.fixture(scope="session")
def demo_tok():
    """The demo model's tokenizer (read from its GGUF once per session: slow on 2 cores)."""
    from engine_helpers import demo_tokenizer

    return demo_tokenizer()


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory, demo_tok):
    """{"llama": folder, "qwen2": folder}: tiny random-weight HF checkpoints with the demo tokenizer."""
    from engine_helpers import make_tiny_model

    tok = demo_tok
    root = tmp_path_factory.mktemp("tiny")
    return {arch: make_tiny_model(root / arch, arch, tok, seed=i) for i, arch in enumerate(["llama", "qwen2"])}
