"""`wslm generate` / `wslm chat` run the engine from a terminal."""

import json
import subprocess
import sys


def test_generate_json_and_chat_repl():
    out = subprocess.run(
        [sys.executable, "-m", "wslm", "generate", "The capital of France is", "--temperature", "0",
         "--max-tokens", "6", "--json"],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert "Paris" in result["text"] and result["finish_reason"] == "length" and result["prompt_tokens"] == 5
    chat = subprocess.run(
        [sys.executable, "-m", "wslm", "chat", "--temperature", "0", "--max-tokens", "8"],
        input="What is the capital of France?\n\n", capture_output=True, text=True, timeout=300, check=True,
    )
    assert "Paris" in chat.stdout


def test_generate_reports_a_missing_model():
    out = subprocess.run(
        [sys.executable, "-m", "wslm", "generate", "hi", "--model", "/nonexistent/model.gguf"],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 1 and "No such model file or folder" in out.stderr
