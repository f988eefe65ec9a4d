"""A vision checkpoint's HF processor (AutoProcessor). Some processors (Qwen2.5-VL's) also hold a video
processor, which transformers builds only with torchvision installed; wslm takes images, not videos, and does
not install torchvision, so such a processor is built without its video half: the same class, the same image
processor, tokenizer and chat template, so the image expansion and pixels are still transformers' own."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

from wslm.backend.errors import RequestError
from wslm.backend.modeling.vision import PROCESSOR_FILES


def load_processor(folder: str | Path, overrides: dict[str, Any] | None = None) -> Any:
    """overrides: the image processor's settings over the checkpoint's (--mm-processor-kwargs)."""
    from transformers import AutoProcessor

    overrides = overrides or {}
    try:
        return AutoProcessor.from_pretrained(folder, **overrides)
    except (ImportError, OSError) as exc:
        # ImportError: the video processor needs torchvision; OSError: a folder saved without a video half
        # has no video_preprocessor_config.json.
        if "video" not in str(exc).lower() and "torchvision" not in str(exc).lower():
            raise
        return _without_video(Path(folder), overrides)


def image_only(cls: type) -> type:
    """A subclass of the processor class `cls` that takes no video processor (ProcessorMixin reads a
    processor's parts from its __init__'s parameters, so this one has only the image processor and tokenizer)."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs) -> None:
        cls.__init__(self, image_processor=image_processor, tokenizer=tokenizer, video_processor=None,
                     chat_template=chat_template, **kwargs)

    return type(cls.__name__, (cls,), {"__init__": __init__, "__module__": __name__})


def _without_video(folder: Path, overrides: dict[str, Any]) -> Any:
    import transformers
    from transformers import AutoImageProcessor, AutoTokenizer

    name = None
    for file in PROCESSOR_FILES:
        if (folder / file).is_file():
            name = name or json.loads((folder / file).read_text()).get("processor_class")
    cls = getattr(transformers, name or "", None)
    if cls is None or "video_processor" not in inspect.signature(cls.__init__).parameters:
        raise ImportError(f"The processor of {folder} needs torchvision (pip install torchvision), and wslm "
                          f"cannot build its {name or 'processor'} without it.")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return image_only(cls)(AutoImageProcessor.from_pretrained(folder, **overrides), tokenizer,
                           chat_template=_chat_template(folder) or getattr(tokenizer, "chat_template", None))


def _chat_template(folder: Path) -> str | None:
    """The processor's own chat template, as AutoProcessor reads it (chat_template.jinja, or the older
    chat_template.json); None: the tokenizer's."""
    if (folder / "chat_template.jinja").is_file():
        return (folder / "chat_template.jinja").read_text()
    if (folder / "chat_template.json").is_file():
        return json.loads((folder / "chat_template.json").read_text()).get("chat_template")
    return None


def split_per_image(tensors: dict[str, Any], count: int) -> list[dict[str, Any]]:
    """The processor's image tensors for a prompt's `count` images -> one dict per image. Most processors give
    one row per image; Qwen2.5-VL's give pixel_values as every image's patch rows one after another, split
    here by each image's image_grid_thw (t * h * w rows)."""
    per_image: list[dict[str, Any]] = [{} for _ in range(count)]
    grid = tensors.get("image_grid_thw")
    for key, value in tensors.items():
        shape = getattr(value, "shape", None)
        if key == "pixel_values" and grid is not None and shape is not None and shape[0] == int(grid.prod(-1).sum()):
            for data, part in zip(per_image, value.split(grid.prod(-1).tolist())):
                data[key] = part
            continue
        if shape is None or shape[0] != count:
            raise RequestError(f"wslm cannot split this processor's {key!r} per image yet.", param="messages")
        for i, data in enumerate(per_image):
            data[key] = value[i : i + 1]
    return per_image


def token_grid(data: dict[str, Any], processor: Any, length: int) -> tuple[int, int, int]:
    """An image's grid of placeholder tokens (t, h, w) for M-RoPE: its image_grid_thw (in patches) with each
    merge_size x merge_size patches merged into one token."""
    merge = int(getattr(processor.image_processor, "merge_size", 1) or 1)
    t, h, w = (int(v) for v in data["image_grid_thw"].reshape(-1)[:3])
    grid = (t, h // merge, w // merge)
    if grid[0] * grid[1] * grid[2] != length:
        raise RuntimeError(f"An image's token grid {grid} does not match its {length} placeholder tokens.")
    return grid


def processor_overrides(value: str | dict | None) -> dict[str, Any]:
    """--mm-processor-kwargs (JSON text, or a dict from the offline LLM) -> a dict; ValueError naming the flag."""
    if not value:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--mm-processor-kwargs is not JSON ({exc}); e.g. '{{\"max_pixels\": 1003520}}'.") from None
    if not isinstance(value, dict):
        raise ValueError("--mm-processor-kwargs takes a JSON object, e.g. '{\"max_pixels\": 1003520}'.")
    return value
