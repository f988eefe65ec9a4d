"""Security of a local server: browser origins, DNS rebinding (Host header), the no-key warning beyond
loopback, API keys never logged, chat templates sandboxed, hub downloads confined to the cache. Real
`wslm serve` processes on a tiny random Llama (fast to load)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from hub_server import FakeHub, make_tiny_llama
from test_server_helpers import ServerProcess

KEY = "sk-secret-do-not-log-4242"
TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
TINY_FLAGS = ["--kv-cache-memory", "8MiB", "--dtype", "float32", "--uvicorn-log-level", "info",
              "--chat-template", TEMPLATE]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("tiny-sec"))


@pytest.fixture(scope="module")
def server(tiny):
    srv = ServerProcess("--model", str(tiny), "--port", "0", "--api-key", KEY,
                        "--allowed-origins", '["https://good.example"]', *TINY_FLAGS)
    yield srv
    srv.stop()


def _chat(url: str, headers: dict | None = None, **extra) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **extra}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {KEY}", **(headers or {})})


def test_browser_origins(server):
    url = server.url
    assert _chat(url).status_code == 200  # no Origin: curl, the openai client, the GUI
    for origin in ("http://localhost:3000", "http://127.0.0.1:8080", "http://[::1]:5173", "https://good.example"):
        r = _chat(url, {"Origin": origin})
        assert r.status_code == 200, (origin, r.text)
        assert r.headers["access-control-allow-origin"] == origin
    for origin in ("https://evil.example", "null", "http://localhost.evil.example", "http://127.0.0.1.evil.example"):
        r = _chat(url, {"Origin": origin})
        assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed", (origin, r.text)
        assert "--allowed-origins" in r.json()["error"]["message"]
    # A CORS preflight from a loopback page is answered; one from elsewhere is refused.
    pre = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization,content-type"}
    ok = httpx.options(url + "/v1/chat/completions", headers={"Origin": "http://localhost:3000", **pre})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "http://localhost:3000"
    assert httpx.options(url + "/v1/chat/completions", headers={"Origin": "https://evil.example", **pre}
                         ).status_code == 403


def test_dns_rebinding_host_check(server):
    port = server.ready["port"]
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "localhost", f"app.localhost:{port}"):
        assert _chat(server.url, {"Host": host}).status_code == 200, host
    for host in (f"attacker.example:{port}", "attacker.example", f"192.168.1.5:{port}", f"127.0.0.1.nip.io:{port}"):
        r = _chat(server.url, {"Host": host})
        assert r.status_code == 403 and r.json()["error"]["code"] == "host_not_allowed", (host, r.text)
    assert httpx.get(server.url + "/health", headers={"Host": "attacker.example"}).status_code == 403


def test_chat_template_is_sandboxed(server):
    for template in ("{{ ''.__class__.__mro__[1].__subclasses__() }}",
                     "{{ messages.__class__.__init__.__globals__['os'].system('touch /tmp/wslm-pwned') }}",
                     "{{ os.system('touch /tmp/wslm-pwned') }}",
                     "{% for m in messages %}{{ m.__class__.__base__ }}{% endfor %}"):
        r = _chat(server.url, chat_template=template)
        assert r.status_code == 400, (template, r.text)
        assert "chat template" in r.json()["error"]["message"]
    assert not os.path.exists("/tmp/wslm-pwned")
    assert _chat(server.url).status_code == 200


def test_api_key_never_logged(server):
    assert server.ready["api_key_required"] is True and "warning" not in server.ready
    r = httpx.get(server.url + "/v1/models", headers={"Authorization": "Bearer sk-wrong-key-777"})
    assert r.status_code == 401
    assert _chat(server.url).status_code == 200
    server.stop()
    logs = server.stderr() + "".join(server.stdout_lines)
    assert "POST /v1/chat/completions" in logs  # the access log was on
    assert KEY not in logs and "sk-wrong-key-777" not in logs


def test_no_key_beyond_loopback_warns_loudly(tiny):
    srv = ServerProcess("--model", str(tiny), "--host", "0.0.0.0", "--port", "0", *TINY_FLAGS,
                        env={"WSLM_API_KEY": ""})
    try:
        ready = srv.ready
        assert ready["api_key_required"] is False and "NO API key" in ready["warning"]
        assert "--api-key" in ready["warning"]
        assert "WARNING" in srv.stderr() and "NO API key" in srv.stderr()
        # Bound beyond loopback: any Host is fine (LAN clients use the machine's address).
        r = httpx.post(f"http://127.0.0.1:{ready['port']}/v1/completions", headers={"Host": "my-pc.lan"},
                       json={"prompt": "hi", "max_tokens": 2}, timeout=60)
        assert r.status_code == 200, r.text
    finally:
        srv.stop()


def test_bad_allowed_origins_flag_is_a_start_error():
    from argparse import Namespace

    from wslm.backend.entrypoints.openai.launcher import StartupError, check_limit_flags

    for flag, value in (("allowed_origins", "[not json"), ("allowed_hosts", '[1, 2]'), ("max_json_depth", 0)):
        args = Namespace(**{flag: value})
        with pytest.raises(StartupError, match=flag.replace("_", "-")):
            check_limit_flags(args)
    args = Namespace(allowed_origins='["https://a.example"]', allowed_hosts="proxy.lan, other.lan")
    check_limit_flags(args)
    assert args.allowed_origins_list == ["https://a.example"] and args.allowed_hosts_list == ["proxy.lan", "other.lan"]


def test_hub_names_outside_the_cache_are_refused(tmp_path):
    files = {"config.json": b"{}", "../../../escaped.txt": b"x", "model.safetensors": b"0" * 64}
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_CACHE": str(tmp_path / "cache" / "hub"),
           "WSLM_MODELS_DIR": str(tmp_path / "models"), "WSLM_CONFIG_DIR": str(tmp_path / "config")}
    for var in ("HF_TOKEN", "HF_ENDPOINT", "HF_HUB_OFFLINE"):
        env.pop(var, None)
    with FakeHub() as hub:
        hub.add_repo("org/evil", files)
        repo = hub.repos["org/evil"]
        config, evil = repo.files["config.json"], repo.files["../../../escaped.txt"]
        for name in ("../../../escaped.txt", "sub/../../../escaped.txt", "/tmp/escaped.txt"):
            repo.files = {"config.json": config, name: evil}
            p = subprocess.run([sys.executable, "-m", "wslm", "models", "pull", "org/evil", "--file", "*escaped.txt", "--endpoint", hub.url,
                                "--json"], env=env, capture_output=True, text=True, timeout=120)
            assert p.returncode != 0 and "unsafe file name" in p.stdout + p.stderr, (name, p.stdout, p.stderr)
    written = [str(f) for f in tmp_path.rglob("escaped.txt")]
    assert not written and not Path("/tmp/escaped.txt").exists()
