"""Embedding models: which task a checkpoint serves, how its token states become one vector (the
sentence-transformers config files say: modules.json, 1_Pooling/config.json, the Normalize module,
sentence_bert_config.json's max_seq_length and do_lower_case, read as vLLM reads them), and the finishing
steps every embedding takes (Matryoshka truncation, L2 normalisation). torch is imported only where tensors are
handled: the model catalog reads the architecture sets without it."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

logger = logging.getLogger("wslm.engine")

# Encoder checkpoints (bidirectional attention) served by the encoder engine (modeling/models/bert.py).
ENCODER_ARCHITECTURES = {"BertModel", "BertForMaskedLM", "BertForPreTraining", "RobertaModel", "RobertaForMaskedLM",
                         "XLMRobertaModel", "XLMRobertaForMaskedLM"}
# Cross-encoders (bge-reranker, ms-marco MiniLM): a query/document pair in, one relevance score out.
CROSS_ENCODER_ARCHITECTURES = {"BertForSequenceClassification", "RobertaForSequenceClassification",
                               "XLMRobertaForSequenceClassification"}
ENCODER_ARCHITECTURES |= CROSS_ENCODER_ARCHITECTURES


@dataclass(slots=True)
class PoolerConfig:
    pooling: str  # "mean", "cls" or "last"
    normalize: bool = True
    matryoshka: bool = False  # `dimensions` may cut the vector (the model was trained for it)
    matryoshka_dimensions: list[int] | None = None  # the sizes it was trained for, when the config lists them
    source: str = "default"  # where the pooling came from, for the start-up log
    # The Pooling module's include_prompt (false: instruction tokens are left out of the mean). The server
    # adds no prompt (docs/embeddings.md), so there is nothing to leave out; kept for the log.
    include_prompt: bool = True
    max_seq_length: int | None = None  # sentence_bert_config.json: inputs are cut (or refused) beyond it
    do_lower_case: bool = False  # sentence_bert_config.json: text is lower-cased before tokenizing


def read_json(path: Path) -> dict | list | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def st_modules(folder: Path) -> list[dict]:
    data = read_json(folder / "modules.json")
    return [m for m in data if isinstance(m, dict)] if isinstance(data, list) else []


def detect_task(folder: Path | None, architecture: str, requested: str) -> str:
    """"generate", "embed" or "score". requested: --task (auto, generate, embed, embedding, score). Auto
    picks score for cross-encoders, embed for other encoder checkpoints, bare decoder bodies (`Qwen3Model`:
    no LM head) and sentence-transformers checkpoints (a modules.json with a Pooling module, such as
    Qwen3-Embedding)."""
    if architecture in CROSS_ENCODER_ARCHITECTURES and requested in ("auto", "score", "pooling"):
        return "score"
    if requested == "score":
        raise ValueError(f"--task score needs a cross-encoder (such as bge-reranker: "
                         f"*ForSequenceClassification), not {architecture or 'this model'}.")
    if requested in ("embed", "embedding", "pooling"):
        return "embed"
    if requested == "generate":
        if architecture in ENCODER_ARCHITECTURES:
            raise ValueError(f"{architecture} is an encoder: it embeds text but cannot generate it. Serve it "
                             "with --task embed (or leave --task auto).")
        return "generate"
    if architecture in ENCODER_ARCHITECTURES or (architecture.endswith("Model") and "For" not in architecture):
        return "embed"
    if folder is not None and any(str(m.get("type", "")).endswith("Pooling") for m in st_modules(folder)):
        return "embed"
    return "generate"


# The names sentence-transformers (and vLLM) look for, in this order, beside the Transformer module.
_ST_CONFIG_NAMES = ("sentence_bert_config.json", "sentence_roberta_config.json", "sentence_distilbert_config.json",
                    "sentence_camembert_config.json", "sentence_albert_config.json",
                    "sentence_xlm-roberta_config.json", "sentence_xlnet_config.json")


def pooler_config(folder: Path | None, hf_config: dict, is_encoder: bool) -> PoolerConfig:
    """Pooling from the sentence-transformers files when the checkpoint has them; otherwise vLLM's defaults
    (CLS for encoders, the last token for decoders, normalised). With a Pooling module in modules.json the
    vector is normalised only when a Normalize module follows it (as sentence-transformers does, and vLLM's
    get_pooling_config); a request's `normalize` still overrides."""
    default = "cls" if is_encoder else "last"
    mode, source, normalize, include_prompt = default, "default", True, True
    st: dict = {}
    modules = st_modules(folder) if folder is not None else []
    has_pooling = any(str(m.get("type", "")).endswith("Pooling") for m in modules)
    for m in modules:
        kind = str(m.get("type", ""))
        if kind.endswith("Pooling"):
            cfg = read_json(folder / str(m.get("path", "")) / "config.json") or {}
            mode = _pooling_mode(cfg) or default
            include_prompt = bool(cfg.get("include_prompt", True))
            source = f"{m.get('path')}/config.json"
        elif kind.endswith("Dense"):
            raise ValueError(f"This sentence-transformers model has a Dense module ({m.get('path')}) after pooling, "
                             "which wslm does not run: its embeddings would be wrong. Pick a model without one.")
        elif kind.endswith("Transformer") and not st:
            st = _st_transformer_config(folder / str(m.get("path", "")))
    if has_pooling:
        normalize = any(str(m.get("type", "")).endswith("Normalize") for m in modules)
        if not st and folder is not None:
            st = _st_transformer_config(folder)
    dims = hf_config.get("matryoshka_dimensions")
    max_seq = st.get("max_seq_length")
    if max_seq is None and has_pooling and folder is not None:
        # sentence-transformers without a max_seq_length (6.x saves none): the tokenizer's model_max_length,
        # which sentence-transformers then uses (capped by the positions, as the encoder engine caps it).
        tok = read_json(folder / "tokenizer_config.json")
        limit = tok.get("model_max_length") if isinstance(tok, dict) else None
        max_seq = limit if isinstance(limit, int) and limit < 1_000_000 else None
    return PoolerConfig(
        pooling=mode,
        normalize=normalize,
        matryoshka=bool(hf_config.get("is_matryoshka") or dims),
        matryoshka_dimensions=[int(d) for d in dims] if isinstance(dims, list) else None,
        source=source,
        include_prompt=include_prompt,
        max_seq_length=int(max_seq) if isinstance(max_seq, int) and max_seq > 0 else None,
        do_lower_case=bool(st.get("do_lower_case", False)),
    )


def _st_transformer_config(folder: Path) -> dict:
    for name in _ST_CONFIG_NAMES:
        data = read_json(folder / name)
        if isinstance(data, dict):
            return data
    return {}


# sentence-transformers 5+ writes one "pooling_mode" name; older versions one boolean per mode.
_MODE_NAMES = {"cls": "cls", "cls_token": "cls", "mean": "mean", "mean_tokens": "mean", "lasttoken": "last",
               "last": "last"}


def _pooling_mode(cfg: dict) -> str | None:
    named = cfg.get("pooling_mode")
    if isinstance(named, str):
        if named not in _MODE_NAMES:
            raise ValueError(f"Pooling {named!r} (1_Pooling/config.json) is not supported by wslm: only cls, mean "
                             "and last-token pooling are.")
        return _MODE_NAMES[named]
    if cfg.get("pooling_mode_cls_token"):
        return "cls"
    if cfg.get("pooling_mode_mean_tokens"):
        return "mean"
    if cfg.get("pooling_mode_lasttoken"):
        return "last"
    unsupported = [k for k in ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                               "pooling_mode_weightedmean_tokens") if cfg.get(k)]
    if unsupported:
        raise ValueError(f"Pooling {unsupported[0].removeprefix('pooling_mode_')} (1_Pooling/config.json) is not "
                         "supported by wslm: only cls, mean and last-token pooling are.")
    return None


def pool(hidden: torch.Tensor, lengths: list[int], mode: str) -> torch.Tensor:
    """[batch, seq, dim] padded states (valid tokens first) -> [batch, dim] fp32."""
    import torch

    hidden = hidden.float()
    if mode == "cls":
        return hidden[:, 0]
    if mode == "last":
        idx = torch.tensor([n - 1 for n in lengths], device=hidden.device)
        return hidden[torch.arange(len(lengths), device=hidden.device), idx]
    mask = torch.zeros(hidden.shape[:2], dtype=hidden.dtype, device=hidden.device)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1.0
    return (hidden * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True).clamp(min=1.0)


def finish(vector: torch.Tensor, dimensions: int | None, normalize: bool) -> torch.Tensor:
    """Matryoshka truncation to `dimensions`, then L2 normalisation (in that order, so a cut vector is unit
    length again)."""
    import torch

    if dimensions is not None:
        vector = vector[..., :dimensions]
    if normalize:
        vector = torch.nn.functional.normalize(vector.float(), p=2, dim=-1)
    return vector


def check_dimensions(dimensions: int | None, hidden_size: int, cfg: PoolerConfig, model: str) -> None:
    """vLLM's rules for `dimensions`: only for Matryoshka models, within the vector (and among the trained
    sizes when the config lists them). ValueError carries the message for a 400."""
    if dimensions is None:
        return
    if not cfg.matryoshka:
        raise ValueError(f"The model {model!r} does not support Matryoshka representation: `dimensions` would cut "
                         "its embeddings and give poor results. Leave `dimensions` out (its config.json has no "
                         "is_matryoshka / matryoshka_dimensions).")
    if dimensions < 1 or dimensions > hidden_size:
        raise ValueError(f"dimensions must be between 1 and the model's embedding size ({hidden_size}), "
                         f"got {dimensions}.")
    allowed = cfg.matryoshka_dimensions
    if allowed and dimensions not in allowed:
        raise ValueError(f"dimensions={dimensions} is not one this model was trained for: {sorted(allowed)}.")
