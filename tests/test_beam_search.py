"""Beam search (issue 35 item 5; vLLM's LLM.beam_search and `use_beam_search`): width 1 is greedy decoding,
every beam's cumulative logprob is the model's own score of that sequence, beams come best first and
distinct, and the server's completions and chat give the offline search's beams (plain and streamed)."""

from __future__ import annotations

import json

import httpx
import pytest
from test_server_helpers import SMALL, ServerProcess

from wslm.backend import BeamSearchParams, SamplingParams
from wslm.backend.frontend.beam_search import beam_score

PROMPT = "The best way to learn a language is"


def test_width_one_is_greedy(demo_llm):
    beams = demo_llm.beam_search([PROMPT], BeamSearchParams(beam_width=1, max_tokens=8, ignore_eos=True))
    greedy = demo_llm.generate(PROMPT, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))[0]
    assert beams[0].sequences[0].token_ids == greedy.outputs[0].token_ids


def test_beams_are_scored_sorted_and_distinct(demo_llm):
    params = BeamSearchParams(beam_width=3, max_tokens=6)
    seqs = demo_llm.beam_search([{"prompt": PROMPT}], params)[0].sequences
    assert len(seqs) == 3 and len({tuple(s.token_ids) for s in seqs}) == 3
    eos = set(demo_llm.llm_engine.model_config.eos_token_ids)
    scores = [beam_score(s.tokens, s.cum_logprob, eos, params.length_penalty) for s in seqs]
    assert scores == sorted(scores, reverse=True)
    for s in seqs:  # the model's own logprobs of each beam's tokens, scored as a prompt
        out = demo_llm.generate({"prompt_token_ids": s.tokens}, SamplingParams(max_tokens=1, prompt_logprobs=0))[0]
        own = sum(out.prompt_logprobs[i][t].logprob for i, t in enumerate(s.tokens) if i >= s.num_prompt_tokens)
        assert s.cum_logprob == pytest.approx(own, abs=2e-3)
        assert s.text == demo_llm.get_tokenizer().decode(
            s.token_ids[:-1] if s.finish_reason == "stop" else s.token_ids, skip_special_tokens=True)


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess("demo", "--port", "0", *SMALL, "--dtype", "float32", env={"WSLM_GGUF_DEQUANTIZE": "1"})
    yield srv
    srv.stop()


def test_server_beam_search_matches_offline(server, demo_llm):
    offline = demo_llm.beam_search([PROMPT], BeamSearchParams(beam_width=2, max_tokens=5, ignore_eos=True))
    expected = [s.text for s in offline[0].sequences]
    body = {"model": "demo", "prompt": PROMPT, "n": 2, "max_tokens": 5, "use_beam_search": True,
            "ignore_eos": True}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    assert [c["text"] for c in r.json()["choices"]] == expected
    assert r.json()["usage"]["completion_tokens"] == 10
    with httpx.stream("POST", server.url + "/v1/completions", json={**body, "stream": True}, timeout=300) as s:
        chunks = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
    assert [c["choices"][0]["text"] for c in chunks if c["choices"]] == expected
    chat = httpx.post(server.url + "/v1/chat/completions", timeout=300, json={
        "model": "demo", "messages": [{"role": "user", "content": "Hi"}], "n": 2, "max_tokens": 4,
        "use_beam_search": True})
    assert chat.status_code == 200 and len(chat.json()["choices"]) == 2, chat.text
    bad = httpx.post(server.url + "/v1/completions", json={**body, "logprobs": 2}, timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "logprobs"
    bad = httpx.post(server.url + "/v1/completions", json={**body, "use_beam_search": False,
                                                            "length_penalty": 0.5}, timeout=60)
    assert bad.status_code == 400 and "use_beam_search" in bad.text
