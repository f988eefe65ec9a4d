"""Sampling settings, stop conditions, logprobs, n > 1 and streaming text on the demo model."""

import pytest

from wslm.backend import SamplingParams
from wslm.backend.engine.core import EngineCoreOutput
from wslm.backend.frontend.output_processor import OutputProcessor


def test_seeded_sampling_is_reproducible_and_batch_independent(demo_llm):
    p = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, seed=1234, max_tokens=16, ignore_eos=True)
    alone = demo_llm.generate("Tell me a story about a cat", p)[0].outputs[0].token_ids
    others = [SamplingParams(temperature=0.8, max_tokens=10) for _ in range(5)]
    batch = demo_llm.generate(["Tell me a story about a cat"] + [f"Prompt {i}" for i in range(5)], [p] + others)
    assert batch[0].outputs[0].token_ids == alone
    different = demo_llm.generate("Tell me a story about a cat", p.clone(seed=99))[0].outputs[0].token_ids
    assert different != alone


def test_greedy_and_sampling_settings_change_what_they_should(demo_llm):
    base = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompt = "List the colours: red, blue, red, blue, red,"
    plain = demo_llm.generate(prompt, base)[0].outputs[0].token_ids
    penalised = demo_llm.generate(prompt, base.clone(repetition_penalty=1.8))[0].outputs[0].token_ids
    freq = demo_llm.generate(prompt, base.clone(frequency_penalty=2.0, presence_penalty=1.0))[0].outputs[0]
    assert penalised != plain and freq.token_ids != plain
    # top_k=1 is greedy whatever the temperature.
    k1 = demo_llm.generate(prompt, base.clone(temperature=1.5, top_k=1, seed=3))[0].outputs[0].token_ids
    assert k1 == plain
    minp = demo_llm.generate(prompt, base.clone(temperature=1.0, min_p=1.0, seed=5))[0].outputs[0].token_ids
    assert minp == plain


def test_max_tokens_min_tokens_and_stop_token_ids(demo_llm):
    eos = demo_llm.get_tokenizer().eos_token_id
    msgs = [{"role": "user", "content": "Say hi."}]
    short = demo_llm.chat(msgs, SamplingParams(temperature=0, max_tokens=64))[0].outputs[0]
    assert short.finish_reason == "stop" and short.token_ids[-1] == eos
    forced = demo_llm.chat(msgs, SamplingParams(temperature=0, max_tokens=64, min_tokens=len(short.token_ids) + 5))
    assert eos not in forced[0].outputs[0].token_ids[: len(short.token_ids) + 4]
    length = demo_llm.chat(msgs, SamplingParams(temperature=0, max_tokens=3))[0].outputs[0]
    assert length.finish_reason == "length" and len(length.token_ids) == 3
    second = short.token_ids[1]
    stopped = demo_llm.chat(msgs, SamplingParams(temperature=0, max_tokens=64, stop_token_ids=[second]))[0]
    assert stopped.outputs[0].token_ids == short.token_ids[:2]
    assert stopped.outputs[0].stop_reason == second
    # As vLLM renders it: the token that stopped the sequence is in token_ids, not in the text (also with
    # special tokens shown), unless include_stop_str_in_output.
    tok = demo_llm.get_tokenizer()
    assert stopped.outputs[0].text == tok.decode(short.token_ids[:1])
    kept = demo_llm.chat(msgs, SamplingParams(temperature=0, max_tokens=64, stop_token_ids=[second],
                                              include_stop_str_in_output=True))[0].outputs[0]
    assert kept.text == tok.decode(short.token_ids[:2])
    shown = demo_llm.chat(msgs, SamplingParams(temperature=0, max_tokens=64, skip_special_tokens=False))[0]
    assert shown.outputs[0].token_ids == short.token_ids and shown.outputs[0].text == short.text
    assert tok.eos_token not in shown.outputs[0].text


def test_stop_strings_cut_exactly(demo_llm):
    p = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    full = demo_llm.generate("1, 2, 3, 4,", p)[0].outputs[0].text
    stop = full.strip().split(",")[2].strip()  # a number a few tokens in
    cut = demo_llm.generate("1, 2, 3, 4,", p.clone(stop=[stop, "never-seen"]))[0].outputs[0]
    assert cut.finish_reason == "stop" and cut.stop_reason == stop
    assert cut.text == full[: full.index(stop)]
    kept = demo_llm.generate("1, 2, 3, 4,", p.clone(stop=stop, include_stop_str_in_output=True))[0].outputs[0]
    assert kept.text == full[: full.index(stop) + len(stop)]


def test_logprobs_top_n(demo_llm):
    out = demo_llm.generate("The capital of France is", SamplingParams(temperature=0, max_tokens=4, logprobs=3))
    c = out[0].outputs[0]
    assert len(c.logprobs) == 4
    for tok, entry in zip(c.token_ids, c.logprobs):
        assert tok in entry and entry[tok].rank == 1  # greedy picks the top token
        assert len(entry) == 3
        assert all(lp.logprob <= 0 for lp in entry.values())
    assert c.cumulative_logprob == pytest.approx(sum(e[t].logprob for t, e in zip(c.token_ids, c.logprobs)))


def test_n_completions_share_the_prompt_blocks(demo_llm):
    engine = demo_llm.llm_engine
    bm = engine.block_manager
    prompt = "Write a sentence about the sea. " * 6  # several full blocks
    engine.add_request("n4", prompt, SamplingParams(n=4, temperature=1.0, seed=7, max_tokens=8, ignore_eos=True))
    outs = {}

    def collect(step_outputs):
        for o in step_outputs:
            for c in o.outputs:
                outs.setdefault(c.index, []).extend(c.token_ids)

    collect(engine.step())  # the prompt, then all four first tokens
    shared = [bm.blocks[b].ref_count for b in engine.requests["n4"].seqs[0].block_table[:-1]]
    assert shared and all(r == 4 for r in shared)
    while engine.has_unfinished_requests():
        collect(engine.step())
    assert sorted(outs) == [0, 1, 2, 3] and all(len(v) == 8 for v in outs.values())
    assert len({tuple(v) for v in outs.values()}) > 1
    assert bm.num_free_blocks == bm.num_blocks


def _stream(tokenizer, text_ids, stop=None):
    """The front end fed what the core sends: one token per step, "length" with the last one."""
    proc = OutputProcessor(tokenizer, max_model_len=10_000)
    params = SamplingParams(max_tokens=len(text_ids), stop=stop, ignore_eos=True)
    seq = proc.add("r", None, [1, 2, 3], params, 0.0).completions[0]
    deltas = []
    for i, tid in enumerate(text_ids):
        last = i == len(text_ids) - 1
        finished = proc.append(seq, EngineCoreOutput("r", 0, [tid], finish_reason="length" if last else None), 0.0)
        d = proc.delta(seq, finished)
        if d is not None:
            deltas.append(d.text)
        if finished:
            break
    return deltas, seq


@pytest.mark.parametrize("text", ["你好，世界！今天天气很好。", "Party time 🎉🎊 with 👩‍👩‍👧 and café ☕"])
def test_streamed_deltas_never_split_a_character(demo_llm, text):
    tok = demo_llm.get_tokenizer()
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) > len(text) // 2  # multi-byte characters span several byte tokens
    deltas, _ = _stream(tok, ids)
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == tok.decode(ids)


def test_reply_cut_inside_a_character_never_ends_in_a_replacement_char(demo_tok):
    # max_tokens can cut a multi-byte character: its bytes stay in the token ids, never U+FFFD in the text.
    ids = demo_tok.encode("ok 🎉👩‍👩‍👧 你好", add_special_tokens=False)
    for cut in range(1, len(ids) + 1):
        deltas, seq = _stream(demo_tok, ids[:cut])
        assert seq.finish_reason == "length" and seq.output_token_ids == ids[:cut]
        assert all("\ufffd" not in d for d in deltas), cut
        assert "".join(deltas) == seq.output_text == demo_tok.decode(ids[:cut]).rstrip("\ufffd")


def test_stop_string_never_streamed_and_tail_released(demo_llm):
    tok = demo_llm.get_tokenizer()
    ids = tok.encode("alpha beta gamma STOP delta", add_special_tokens=False)
    deltas, seq = _stream(tok, ids, stop=["STOP"])
    assert "".join(deltas) == "alpha beta gamma " and seq.stop_reason == "STOP"
    assert not any("ST" in d for d in deltas)
    # No stop string appears: the held-back tail comes out at the end.
    ids2 = tok.encode("alpha beta gamma ST", add_special_tokens=False)
    deltas2, _ = _stream(tok, ids2, stop=["STOP"])
    assert "".join(deltas2) == "alpha beta gamma ST"


def test_chat_template_override_and_missing_template(demo_llm, tiny_models):
    engine = demo_llm.llm_engine
    ids = engine.apply_chat_template([{"role": "user", "content": "hi"}], chat_template="{{ messages[0].content }}!")
    assert demo_llm.get_tokenizer().decode(ids) == "hi!"
    tok = engine.tokenizer
    saved = tok.chat_template
    tok.chat_template = None
    try:
        with pytest.raises(ValueError, match="no chat template.*--chat-template"):
            engine.apply_chat_template([{"role": "user", "content": "hi"}])
    finally:
        tok.chat_template = saved
    with pytest.raises(ValueError, match="does not take images; load a vision model"):
        engine.apply_chat_template([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}])
