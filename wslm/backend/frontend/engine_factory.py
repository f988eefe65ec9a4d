"""create_engine: the engine a checkpoint needs for its task (--task): LLMEngine for text generation and
decoder embedding models, EncoderEngine for BERT-family encoders."""

from __future__ import annotations

import dataclasses
import logging

from wslm.backend.config import EngineConfig
from wslm.backend.loader.model_source import resolve_model
from wslm.backend.modeling.pooler import ENCODER_ARCHITECTURES, detect_task

logger = logging.getLogger("wslm.engine")


def create_engine(config: EngineConfig, core_process: bool = False):
    """core_process: a text-generation model's core runs in a child process (the server's way; see
    engine/core_client.py); encoder and embedding models always run in this process."""
    from wslm.backend.frontend.encoder_engine import EncoderEngine, read_hf_config

    source = resolve_model(config.model, config.revision, config.download_dir)
    hf = read_hf_config(source)
    arch = (hf.get("architectures") or [""])[0]
    task = detect_task(None if source.gguf_file else source.folder, arch, config.task)
    if config.task == "auto" and task != "generate":
        logger.info("Task: %s (from the checkpoint: %s%s); pass --task to override", task, arch or "?",
                    ", sentence-transformers modules.json" if "Model" not in arch and "For" not in arch else "")
    if task in ("embed", "score") and arch in ENCODER_ARCHITECTURES:
        return EncoderEngine(dataclasses.replace(config, task=task), source, hf)
    from wslm.backend.frontend.llm_engine import LLMEngine

    return LLMEngine(dataclasses.replace(config, task=task), core_process=core_process)
