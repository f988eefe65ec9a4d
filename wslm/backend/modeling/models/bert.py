"""BERT-family encoders (BertModel, RobertaModel, XLMRobertaModel: bge-small, all-MiniLM, bge-m3, e5, ...)
for embeddings: bidirectional attention over a padded batch, plain tensors, no KV cache (the encoder
engine runs each request once). The output is the last layer's token states; pooling is pooling.py's."""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F

_ACTIVATIONS = {
    "gelu": lambda x: F.gelu(x),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
}

# Checkpoint prefixes of the same weights (BertForMaskedLM saves "bert.", sentence-transformers exports
# sometimes "model."); the MLM heads (cls., lm_head.) are never used; pooler. and classifier. are the
# cross-encoder's score head (BertForSequenceClassification, XLMRobertaForSequenceClassification).
_PREFIXES = ("bert.", "roberta.", "model.")
_SKIP = ("cls.", "lm_head.")
_HEAD = ("pooler.", "classifier.")


class _Layer:
    __slots__ = ("qkv", "qkv_bias", "o", "o_bias", "ln1", "ln1_bias", "up", "up_bias", "down", "down_bias",
                 "ln2", "ln2_bias")


class BertModel:
    """Also RoBERTa / XLM-RoBERTa: the same encoder, with positions counted from padding_idx + 1."""

    def __init__(self, hf: dict, dtype: torch.dtype, device: torch.device) -> None:
        self.hidden_size = int(hf["hidden_size"])
        self.num_heads = int(hf["num_attention_heads"])
        self.num_layers = int(hf["num_hidden_layers"])
        self.head_dim = self.hidden_size // self.num_heads
        self.eps = float(hf.get("layer_norm_eps", 1e-12))
        self.max_positions = int(hf.get("max_position_embeddings", 512))
        act = hf.get("hidden_act", "gelu")
        if act not in _ACTIVATIONS:
            raise ValueError(f"hidden_act {act!r} of this encoder is not supported (supported: {sorted(_ACTIVATIONS)}).")
        self.act = _ACTIVATIONS[act]
        self.roberta = hf.get("model_type") in ("roberta", "xlm-roberta", "camembert")
        self.position_offset = int(hf.get("pad_token_id", 1)) + 1 if self.roberta else 0
        if self.roberta:
            self.max_positions -= self.position_offset  # the first ids are reserved for padding
        if hf.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"position_embedding_type {hf.get('position_embedding_type')!r} is not supported "
                             "(only absolute positions).")
        self.dtype = dtype
        self.device = device
        self.layers = [_Layer() for _ in range(self.num_layers)]
        self._w: dict[str, torch.Tensor] = {}
        self.head: dict[str, torch.Tensor] = {}  # pooler.* / classifier.* of a cross-encoder

    # ---- weights -------------------------------------------------------------------------------
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        pending: dict[int, dict[str, torch.Tensor]] = {}
        for name, tensor in weights:
            name = _strip(name)
            if name is None:
                continue
            tensor = tensor.to(device=self.device, dtype=self.dtype)
            if name.startswith(_HEAD):
                self.head[name] = tensor
            elif name.startswith("embeddings."):
                self._w[name.removeprefix("embeddings.")] = tensor
            elif name.startswith("encoder.layer."):
                idx, rest = name.removeprefix("encoder.layer.").split(".", 1)
                pending.setdefault(int(idx), {})[rest] = tensor
        for i, layer in enumerate(self.layers):
            w = pending.get(i, {})
            try:
                a = "attention.self."
                layer.qkv = torch.cat([w[a + "query.weight"], w[a + "key.weight"], w[a + "value.weight"]]).contiguous()
                layer.qkv_bias = torch.cat([w[a + "query.bias"], w[a + "key.bias"], w[a + "value.bias"]])
                layer.o, layer.o_bias = w["attention.output.dense.weight"], w["attention.output.dense.bias"]
                layer.ln1, layer.ln1_bias = w["attention.output.LayerNorm.weight"], w["attention.output.LayerNorm.bias"]
                layer.up, layer.up_bias = w["intermediate.dense.weight"], w["intermediate.dense.bias"]
                layer.down, layer.down_bias = w["output.dense.weight"], w["output.dense.bias"]
                layer.ln2, layer.ln2_bias = w["output.LayerNorm.weight"], w["output.LayerNorm.bias"]
            except KeyError as exc:
                raise ValueError(f"The encoder checkpoint is missing layer {i}'s {exc.args[0]}. Is the download "
                                 "complete?") from None
        needed = ("word_embeddings.weight", "position_embeddings.weight", "LayerNorm.weight", "LayerNorm.bias")
        missing = [n for n in needed if n not in self._w]
        if missing:
            raise ValueError(f"The encoder checkpoint is missing embeddings.{missing[0]}. Is the download complete?")

    # ---- forward -------------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, lengths: list[int], token_types: torch.Tensor | None = None
                ) -> torch.Tensor:
        """input_ids [batch, seq] (valid tokens first, then anything); token_types: the segment of each
        token (a query/document pair: 0 then 1), all 0 when None. Returns the last layer's states
        [batch, seq, hidden]. Padding never reaches a valid token (masked keys)."""
        batch, seq = input_ids.shape
        dev = self.device
        positions = torch.arange(seq, device=dev) + self.position_offset
        w = self._w
        h = F.embedding(input_ids, w["word_embeddings.weight"]) + F.embedding(positions, w["position_embeddings.weight"])
        if "token_type_embeddings.weight" in w:
            types = w["token_type_embeddings.weight"]
            h = h + (types[0] if token_types is None else F.embedding(token_types, types))
        h = F.layer_norm(h, (self.hidden_size,), w["LayerNorm.weight"], w["LayerNorm.bias"], self.eps)
        keep = torch.arange(seq, device=dev)[None, :] < torch.tensor(lengths, device=dev)[:, None]
        mask = keep[:, None, None, :]  # [batch, 1, 1, keys]: True = attend
        for layer in self.layers:
            qkv = F.linear(h, layer.qkv, layer.qkv_bias)
            q, k, v = (t.view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2)
                       for t in qkv.split(self.hidden_size, dim=-1))
            attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            attn = attn.transpose(1, 2).reshape(batch, seq, self.hidden_size)
            h = F.layer_norm(F.linear(attn, layer.o, layer.o_bias) + h, (self.hidden_size,), layer.ln1, layer.ln1_bias,
                             self.eps)
            up = self.act(F.linear(h, layer.up, layer.up_bias))
            h = F.layer_norm(F.linear(up, layer.down, layer.down_bias) + h, (self.hidden_size,), layer.ln2,
                             layer.ln2_bias, self.eps)
        return h


    @torch.inference_mode()
    def score_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """A cross-encoder's logits [batch, num_labels] from its [CLS] state: BERT's pooler (dense + tanh)
        then classifier; RoBERTa's classification head (dense + tanh, then out_proj)."""
        cls = hidden[:, 0]
        h = self.head
        if "classifier.out_proj.weight" in h:
            x = torch.tanh(F.linear(cls, h["classifier.dense.weight"], h["classifier.dense.bias"]))
            return F.linear(x, h["classifier.out_proj.weight"], h["classifier.out_proj.bias"])
        if "pooler.dense.weight" in h:
            cls = torch.tanh(F.linear(cls, h["pooler.dense.weight"], h["pooler.dense.bias"]))
        return F.linear(cls, h["classifier.weight"], h.get("classifier.bias"))

    @property
    def has_score_head(self) -> bool:
        return "classifier.weight" in self.head or "classifier.out_proj.weight" in self.head


def _strip(name: str) -> str | None:
    for prefix in _PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    if name.startswith(_SKIP):
        return None
    # Old TF-converted checkpoints name LayerNorm parameters gamma/beta.
    return name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
