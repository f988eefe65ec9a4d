"""`wslm serve`'s engine flags are generated from EngineConfig's fields: every field has a flag, parsing flags
gives the EngineConfig they name, and `wslm serve --help` lists them (issue 23)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys

import pytest

from wslm.backend.config import EngineConfig
from wslm.backend.entrypoints.cli import engine_flags
from wslm.backend.entrypoints.cli import serve as serve_cli
from wslm.backend.entrypoints.openai.launcher import StartupError, engine_config

FIELDS = [f.name for f in dataclasses.fields(EngineConfig)]


def _serve_parser() -> argparse.ArgumentParser:
    subparsers = argparse.ArgumentParser().add_subparsers()
    serve_cli.register(subparsers)
    return subparsers.choices["serve"]


def _config(*argv: str) -> EngineConfig:
    args = _serve_parser().parse_args(list(argv))
    args.model = args.model or args.model_tag or engine_flags.default("model")  # as serve's handler does
    return engine_config(args)


def test_every_field_has_a_flag_with_help():
    parser = _serve_parser()
    for f in dataclasses.fields(EngineConfig):
        action = parser._option_string_actions.get(engine_flags.flag_name(f.name))
        assert action is not None and action.dest == f.name, f.name
        assert f.metadata.get("help") and action.help == f.metadata["help"], f.name
    assert set(serve_cli.VLLM_GROUP_FIELDS) <= set(FIELDS)


def test_no_flags_give_engine_config_defaults():
    assert _config() == EngineConfig()


def test_flags_give_the_engine_config():
    got = _config(
        "some/model", "--tokenizer", "tok", "--max-model-len", "4k", "--max-num-seqs", "7",
        "--max-num-batched-tokens", "512", "--long-prefill-token-threshold", "64", "--fanout-per-step", "4",
        "--block-size", "32", "--no-enable-prefix-caching", "--device", "cpu", "--dtype", "bfloat16",
        "--gpu-memory-utilization", "0.5", "--kv-cache-memory", "1GiB", "--num-gpu-blocks-override", "100",
        "--chat-template", "{{ messages }}", "--seed", "3", "-tp", "2", "--distributed-executor-backend", "ray",
        "--enforce-eager", "--trust-remote-code", "-q", "int8", "--kv-cache-dtype", "fp8", "--revision", "main",
        "--download-dir", "/hf", "--task", "embedding", "--max-logprobs", "-1",
    )
    assert got == EngineConfig(
        model="some/model", tokenizer="tok", max_model_len=4000, max_num_seqs=7, max_num_batched_tokens=512,
        long_prefill_token_threshold=64, fanout_per_step=4, block_size=32, enable_prefix_caching=False,
        device="cpu", dtype="bfloat16", gpu_memory_utilization=0.5, kv_cache_memory=1 << 30,
        num_gpu_blocks_override=100, chat_template="{{ messages }}", seed=3, tensor_parallel_size=2,
        distributed_executor_backend="ray", enforce_eager=True, trust_remote_code=True, quantization="int8",
        kv_cache_dtype="fp8", revision="main", download_dir="/hf", task="embed", max_logprobs=-1,
    )
    assert _config("--model", "a", "b", "--runner", "pooling", "--max-model-len", "4K").model == "a"  # --model wins
    assert _config("--runner", "pooling").task == "pooling" and _config("--enable-prefix-caching").enable_prefix_caching


def test_bad_values_are_startup_errors_or_argparse_errors(capsys):
    with pytest.raises(StartupError, match="--kv-cache-memory"):
        _config("--kv-cache-memory", "lots")  # an error event for the GUI, as before the flags were generated
    with pytest.raises(StartupError, match="e5m2 is not supported"):
        _config("--kv-cache-dtype", "fp8_e5m2")
    for argv in (["--block-size", "x"], ["--quantization", "int3"], ["--max-model", "4"], ["--no-enforce-eager"]):
        with pytest.raises(SystemExit):
            _serve_parser().parse_args(argv)  # not a number, not a choice, no abbreviation, no --no- form
    assert "unrecognized arguments: --max-model" in capsys.readouterr().err


def test_help_lists_every_engine_flag():
    out = subprocess.run([sys.executable, "-m", "wslm", "serve", "--help"], capture_output=True, text=True,
                         timeout=120, check=True, env={**os.environ, "COLUMNS": "200"}).stdout
    main, vllm = out.split("\nvLLM flags:\n")
    for name in FIELDS:
        assert engine_flags.flag_name(name) in (vllm if name in serve_cli.VLLM_GROUP_FIELDS else main), name
    assert "--enable-prefix-caching, --no-enable-prefix-caching" in main and "--tensor-parallel-size" in main
    assert "accepted for vLLM compatibility" in vllm and "reuse the KV cache of shared prompt prefixes" in main
