"""Choosing one GGUF out of a repo that ships many quantizations (the way LM Studio and Ollama pick a
default): group the files into variants (a split model's shards are one variant), read the quant label
from the name, and take the first in PREFERENCE: a good quality/size balance first."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath

PREFERENCE = [
    "Q4_K_M", "Q4_K_S", "Q5_K_M", "Q5_K_S", "Q8_0", "Q6_K", "Q4_0", "IQ4_XS", "IQ4_NL", "Q5_0", "Q4_1",
    "Q5_1", "Q3_K_L", "Q3_K_M", "IQ3_M", "Q3_K_S", "IQ3_S", "IQ3_XS", "IQ3_XXS", "Q2_K", "Q2_K_S", "IQ2_M",
    "IQ2_S", "IQ2_XS", "IQ2_XXS", "IQ1_M", "IQ1_S", "BF16", "F16", "F32",
]  # fmt: skip
_LABEL_RE = re.compile(
    r"(?:^|[-_.])(I?Q\d_K_[SML]|I?Q\d_K|IQ\d_[A-Z]+|Q\d_\d|TQ\d_\d|MXFP4|BF16|F16|FP16|F32|FP32)(?=$|[-_.])",
    re.IGNORECASE,
)
_SPLIT_RE = re.compile(r"-\d{5}-of-\d{5}$", re.IGNORECASE)
_NOT_MODELS = re.compile(r"(^|/)(mmproj|imatrix)[^/]*$|\.imatrix$", re.IGNORECASE)


@dataclass
class GGUFVariant:
    name: str  # the first (or only) file
    label: str | None  # e.g. "Q4_K_M"; None when the name does not say
    files: list[str] = field(default_factory=list)
    size: int = 0


def quant_label(filename: str) -> str | None:
    stem = _SPLIT_RE.sub("", PurePosixPath(filename).name.removesuffix(".gguf"))
    found = _LABEL_RE.findall(stem)
    if not found:
        return None
    label = found[-1].upper()
    return {"FP16": "F16", "FP32": "F32"}.get(label, label)


def is_model_gguf(filename: str) -> bool:
    return filename.lower().endswith(".gguf") and not _NOT_MODELS.search(filename)


def gguf_variants(files: dict[str, int | None]) -> list[GGUFVariant]:
    """Model GGUFs of a repo grouped into variants; `files` maps repo file name -> size."""
    groups: dict[str, GGUFVariant] = {}
    for name in sorted(files):
        if not is_model_gguf(name):
            continue
        key = _SPLIT_RE.sub("", name.removesuffix(".gguf"))
        variant = groups.setdefault(key, GGUFVariant(name=name, label=quant_label(name)))
        variant.files.append(name)
        variant.size += files[name] or 0
    for v in groups.values():
        v.files.sort()
        v.name = v.files[0]
    return list(groups.values())


def _rank(variant: GGUFVariant) -> tuple[int, int]:
    label = variant.label or ""
    index = PREFERENCE.index(label) if label in PREFERENCE else len(PREFERENCE)
    return (index, variant.size)


def pick_variant(variants: list[GGUFVariant], want: str | None = None) -> GGUFVariant | None:
    """The preferred variant, or the one whose label is `want` (case-insensitive)."""
    if want:
        matching = [v for v in variants if (v.label or "").upper() == want.upper()]
        return min(matching, key=_rank) if matching else None
    return min(variants, key=_rank) if variants else None
