"""`wslm serve --speculative-config`: the openai client gets the same greedy text streamed and not, /metrics
counts drafts and accepted tokens under vLLM's names, and a bad config is a start-up error naming the fix."""

from __future__ import annotations

import json
import re

import httpx
import openai
import pytest
from test_server_helpers import SMALL, ServerProcess

SPEC = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}'
QUOTE = ("Copy this list exactly.\nalpha, beta, gamma, delta, epsilon, zeta, eta, theta\n"
         "alpha, beta, gamma, delta, epsilon, zeta, eta, theta\nalpha,")
NAMES = ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
         "vllm:spec_decode_num_accepted_tokens_total")


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess("--port", "0", "--speculative-config", SPEC, *SMALL)
    yield srv
    srv.stop()


def _counters(server) -> dict[str, int]:
    text = httpx.get(server.url + "/metrics").text
    return {name: int(float(re.search(rf"^{re.escape(name)}{{[^}}]*}} (\S+)$", text, re.M).group(1)))
            for name in NAMES}


def test_openai_client_and_metrics(server):
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    before = _counters(server)
    r = client.completions.create(model=server.ready["model"], prompt=QUOTE, max_tokens=24, temperature=0)
    text = r.choices[0].text
    assert text and r.usage.completion_tokens == 24
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=server.ready["model"], prompt=QUOTE, max_tokens=24, temperature=0, stream=True) if c.choices)
    assert streamed == text
    chat = client.chat.completions.create(model=server.ready["model"], max_tokens=12,
                                          messages=[{"role": "user", "content": QUOTE}])
    assert chat.choices[0].message.content
    after = _counters(server)
    assert after[NAMES[0]] > before[NAMES[0]] and after[NAMES[1]] >= after[NAMES[0]]
    assert after[NAMES[2]] > before[NAMES[2]]


def test_bad_config_is_a_startup_error():
    srv = ServerProcess("--port", "0", "--speculative-config", '{"method": "eagle", "num_speculative_tokens": 2}',
                        *SMALL, wait=False)
    event = srv.wait_event(("ready", "error"), 120)
    srv.proc.wait(60)
    assert event["event"] == "error"
    assert "unknown method 'eagle'" in json.dumps(event) and "ngram" in json.dumps(event)
