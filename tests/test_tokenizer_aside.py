"""frontend/tokenizer_aside.py: a pool model's tokenizer built in a forked helper process comes back whole."""

from __future__ import annotations

from wslm.backend.frontend.tokenizer_aside import _build_aside
from wslm.backend.loader.model_loader import load_tokenizer, resolve_model
from wslm.demo import demo_model_path


def test_a_tokenizer_built_aside_is_the_same_tokenizer():
    source = resolve_model(str(demo_model_path()))
    here, aside = load_tokenizer(source), _build_aside(source, None, False)
    assert aside is not None and type(aside) is type(here)
    text = "Hello, wörld! <|im_start|>user\n1 + 1 = 2"
    assert aside.encode(text) == here.encode(text) and aside.decode(aside.encode(text)) == here.decode(here.encode(text))
    assert aside.chat_template == here.chat_template and aside.eos_token_id == here.eos_token_id
