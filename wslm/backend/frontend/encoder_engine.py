"""EncoderEngine: embeddings from BERT-family encoders (modeling/models/bert.py), with LLMEngine's interface
(add_request / abort_request / step / has_unfinished_requests / get_stats) so that the server's engine loop
and LLM.embed drive it unchanged.

An encoder attends both ways and keeps no KV cache, so the paged decoder path does not fit it: each step
takes the waiting requests first come, first served, up to the token budget (--max-num-batched-tokens)
and --max-num-seqs, runs them as one padded batch, and answers each once."""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from wslm.backend.config import EngineConfig
from wslm.backend.engine.core_setup import note_model_in_process
from wslm.backend.frontend.validation import RequestError, RequestLimits, check_token_ids
from wslm.backend.loader.model_loader import iter_weights, load_tokenizer
from wslm.backend.loader.model_source import ModelSource
from wslm.backend.modeling.models.bert import BertModel
from wslm.backend.modeling.pooler import check_dimensions, finish, pool, pooler_config, read_json
from wslm.backend.outputs import PoolingOutput, PoolingRequestOutput
from wslm.backend.platforms import pick_device
from wslm.backend.pooling_params import PoolingParams

logger = logging.getLogger("wslm.engine")

_DTYPES = {"float32": torch.float32, "float": torch.float32, "fp32": torch.float32, "float16": torch.float16,
           "half": torch.float16, "fp16": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


@dataclass(slots=True)
class _Request:
    request_id: str
    ids: list[int]
    params: PoolingParams
    arrival: float
    types: list[int] | None = None  # token types of a query/document pair (cross-encoders)


class EncoderEngine:
    """task "embed": one vector per input (pooled token states); task "score": a cross-encoder's relevance
    score (sigmoid of its one logit, as sentence-transformers' CrossEncoder) per query/document pair."""

    def __init__(self, config: EngineConfig, source: ModelSource, hf: dict) -> None:
        note_model_in_process()  # later core processes of this server start by spawn (core_setup.py)
        start = time.monotonic()
        if config.tensor_parallel_size > 1:
            raise ValueError("Encoder (BERT-family) embedding models run on one device: drop --tensor-parallel-size.")
        self.config = config
        self.device = pick_device(config.device)
        self.model_name = source.name
        self.tokenizer = load_tokenizer(source, config.tokenizer, config.trust_remote_code)
        arch = (hf.get("architectures") or ["BertModel"])[0]
        # fp32 on CPUs (exact embeddings; encoders are small), the checkpoint's half precision on GPUs.
        if config.dtype != "auto":
            dtype = _DTYPES[config.dtype]
        elif self.device.type == "cpu":
            dtype = torch.float32
        else:
            dtype = _DTYPES.get(str(hf.get("torch_dtype") or "float16"), torch.float16)
            dtype = torch.float16 if dtype == torch.float32 else dtype
        self.model = BertModel(hf, dtype, self.device)
        self.model.load_weights(iter_weights(source, dtype, no_mmap=config.no_mmap))
        self.task = "score" if config.task == "score" else "embed"
        self.pooler = pooler_config(source.folder, hf, is_encoder=True)
        if self.task == "score" and (not self.model.has_score_head or int(hf.get("num_labels", len(
                hf.get("id2label") or {0: 0}))) != 1):
            raise ValueError(f"{arch} is served for scoring only with one output label and its classifier weights "
                             "(a reranker such as bge-reranker).")
        max_len = self.model.max_positions
        if self.pooler.max_seq_length and self.task == "embed":
            # sentence_bert_config.json's max_seq_length, as sentence-transformers cuts and vLLM caps: the
            # model was trained on no more (all-MiniLM-L6-v2: 256 of its 512 positions).
            max_len = min(max_len, self.pooler.max_seq_length)
        if config.max_model_len is not None:
            if config.max_model_len > max_len:
                raise ValueError(f"max_model_len={config.max_model_len} is longer than this encoder's "
                                 f"{max_len} tokens (its positions, or sentence_bert_config.json's max_seq_length). "
                                 f"Use --max-model-len {max_len} or less.")
            max_len = config.max_model_len
        vocab = int(hf["vocab_size"])
        self.model_config = SimpleNamespace(max_model_len=max_len, vocab_size=vocab, architecture=arch,
                                            hidden_size=self.model.hidden_size, dtype=dtype)
        self.max_model_len = max_len
        self.limits = RequestLimits(max_len, vocab, config.max_num_seqs)
        self.chat_template = None
        self.waiting: deque[_Request] = deque()
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        what = ("scoring (query, document) pairs" if self.task == "score" else
                f"embeddings: {self.pooler.pooling} pooling (from {self.pooler.source}), "
                f"{'normalised' if self.pooler.normalize else 'not normalised'}, {self.model.hidden_size}-dim")
        logger.info("Loaded %s (%s encoder, %s) on %s for %s; up to %d tokens; ready in %.1fs", source.name, arch,
                    dtype, self.device, what, max_len, time.monotonic() - start)

    # ---- requests ------------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: str | list[int] | dict, params: PoolingParams | None = None,
                    arrival_time: float | None = None) -> None:
        self.add_engine_request(self.process(request_id, prompt, params, arrival_time))

    def process(self, request_id: str, prompt: str | list[int] | dict, params: PoolingParams | None = None,
                arrival_time: float | None = None, **names) -> _Request:
        """The request tokenized and checked (thread-safe: the server runs it in a worker thread)."""
        params = params.clone() if params is not None else PoolingParams()
        if not isinstance(params, PoolingParams):
            raise ValueError("This server runs an embedding model: it takes embedding requests (/v1/embeddings, "
                             "LLM.embed), not text generation.")
        arrival = time.monotonic() if arrival_time is None else arrival_time
        if self.task == "score":
            if not (isinstance(prompt, dict) and "text_pair" in prompt):
                raise ValueError("This is a cross-encoder: it scores (query, document) pairs (/score, /rerank).")
            enc = self.tokenizer(prompt["text"], prompt["text_pair"], truncation="longest_first",
                                 max_length=self.max_model_len)
            ids, types = list(enc["input_ids"]), enc.get("token_type_ids")
            return _Request(request_id, ids, params, arrival, list(types) if types else None)
        ids = self.encode_prompt(prompt)
        check_dimensions(params.dimensions, self.model.hidden_size, self.pooler, self.model_name)
        return _Request(request_id, ids, params, arrival)

    def add_engine_request(self, req: _Request) -> None:
        self.waiting.append(req)

    def encode_prompt(self, prompt: str | list[int] | dict) -> list[int]:
        """Token ids for a prompt: text is tokenized with the model's special tokens ([CLS] ... [SEP]);
        ids are taken as they are."""
        if isinstance(prompt, dict) and "text_pair" in prompt:
            raise ValueError("This is an embedding model: it embeds single texts, it does not score pairs.")
        if isinstance(prompt, dict):
            prompt = prompt.get("prompt_token_ids", prompt.get("prompt"))
        if isinstance(prompt, str):
            if self.pooler.do_lower_case:  # sentence_bert_config.json's do_lower_case, as vLLM applies it
                prompt = prompt.lower()
            ids = list(self.tokenizer(prompt)["input_ids"])
        else:
            ids = list(prompt or [])
            check_token_ids(ids, self.limits.vocab_size, "input")
        if not ids:
            raise RequestError("The input must not be empty.", param="input")
        if len(ids) > self.max_model_len:
            raise RequestError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, an input has "
                f"{len(ids)} tokens. Please shorten it (or split the text into chunks).",
                param="input", code="context_length_exceeded",
            )
        return ids

    def abort_request(self, request_id: str | list[str]) -> None:
        ids = {request_id} if isinstance(request_id, str) else set(request_id)
        self.waiting = deque(r for r in self.waiting if r.request_id not in ids)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting)

    # ---- the step ------------------------------------------------------------------------------
    def step(self) -> list[PoolingRequestOutput]:
        batch = self._take_batch()
        if not batch:
            return []
        try:
            vectors = self._run(batch)
        except Exception as exc:  # one broken batch must not take the server down
            logger.exception("Encoder step failed")
            message = f"The engine failed on this request: {type(exc).__name__}: {exc}"
            return [PoolingRequestOutput(r.request_id, None, r.ids, True, error=message) for r in batch]
        self.prompt_tokens_total += sum(len(r.ids) for r in batch)
        return [PoolingRequestOutput(r.request_id, PoolingOutput(v), r.ids) for r, v in zip(batch, vectors)]

    def _take_batch(self) -> list[_Request]:
        batch: list[_Request] = []
        tokens = 0
        while self.waiting and len(batch) < self.config.max_num_seqs:
            n = len(self.waiting[0].ids)
            if batch and tokens + n > self.config.max_num_batched_tokens:
                break
            batch.append(self.waiting.popleft())
            tokens += n
        return batch

    def _run(self, batch: list[_Request]) -> list[torch.Tensor]:
        lengths = [len(r.ids) for r in batch]
        width = max(lengths)
        ids = torch.zeros((len(batch), width), dtype=torch.int64)
        types = torch.zeros((len(batch), width), dtype=torch.int64) if any(r.types for r in batch) else None
        for i, r in enumerate(batch):
            ids[i, : len(r.ids)] = torch.tensor(r.ids)
            if types is not None and r.types:
                types[i, : len(r.types)] = torch.tensor(r.types)
        hidden = self.model.forward(ids.to(self.device), lengths, None if types is None else types.to(self.device))
        if self.task == "score":
            scores = torch.sigmoid(self.model.score_logits(hidden).float())  # [batch, 1]
            return [s.cpu() for s in scores]
        pooled = pool(hidden, lengths, self.pooler.pooling)
        out = []
        for r, vec in zip(batch, pooled):
            normalize = self.pooler.normalize if r.params.normalize is None else r.params.normalize
            out.append(finish(vec, r.params.dimensions, normalize).float().cpu())
        return out

    # ---- the rest of the engine interface ---------------------------------------------------------
    def apply_chat_template(self, messages: list[dict], **kwargs) -> list[int]:
        raise ValueError("This is an embedding model: it has no chat template. Send text to /v1/embeddings.")

    def get_stats(self) -> dict:
        return {"num_requests_running": 0, "num_requests_waiting": len(self.waiting), "kv_cache_usage": 0.0,
                "num_blocks": 0, "num_free_blocks": 0, "prefix_cache_queries": 0, "prefix_cache_hits": 0,
                "prompt_tokens_total": self.prompt_tokens_total, "generation_tokens_total": 0,
                "num_preemptions_total": 0}

    def shutdown(self) -> None:
        pass

    def check_health(self) -> None:
        pass


def read_hf_config(source: ModelSource) -> dict:
    if source.gguf_file:
        return {}
    data = read_json(source.folder / "config.json")
    return data if isinstance(data, dict) else {}
