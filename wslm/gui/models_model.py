"""The Models table: what `wslm models list --json` reports, with a fits-in-GPU hint."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QAbstractTableModel, QModelIndex, Qt
from PySide6.QtGui import QColor

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm import defaults
from wslm.gui import theme
from wslm.gui.format import human_bytes, human_count

COLUMNS = ["Model", "Architecture", "Params", "Format", "Quant", "Size", "Context", "Fits GPU?"]
ModelRole = Qt.ItemDataRole.UserRole + 1


def display_name(model: dict) -> str:
    """The name users know: the hub repo (owner/name) or the file name, not GGUF's general.name
    ("Smollm2 135M 8k Lc100K Mix1 Ep2")."""
    if model.get("repo_id"):
        return str(model["repo_id"])
    path = str(model.get("path") or "")
    if model.get("format") == "gguf" and path:
        return Path(path).name
    return str(model.get("id") or Path(path).name)


def fit_hint(model: dict, vram_total_bytes: int | None, gpu_share: float = defaults.GPU_MEMORY_UTILIZATION,
             no_gpu: bool = False) -> tuple[str, str]:
    """(text, color): whether the model's memory estimate fits the GPU memory share."""
    if not model.get("supported", True):
        return "unsupported", theme.ERROR
    if no_gpu:
        return "no GPU (CPU)", theme.MUTED
    need = model.get("memory_estimate_bytes") or model.get("size_bytes")
    if not vram_total_bytes or not need:
        return "unknown", theme.MUTED
    budget = vram_total_bytes * gpu_share
    if need <= budget * 0.8:
        return "yes", theme.OK
    if need <= budget:
        return "tight", theme.WARN
    return "no", theme.ERROR


class ModelsTableModel(QAbstractTableModel):
    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.models: list[dict] = []
        self.vram_total_bytes: int | None = None
        self.gpu_share = defaults.GPU_MEMORY_UTILIZATION
        self.no_gpu = False  # nvidia-smi found no GPU on the target

    def rowCount(self, parent: QModelIndex = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self.models)

    def columnCount(self, parent: QModelIndex = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(COLUMNS)

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole):
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            return COLUMNS[section]
        return None

    def data(self, index: QModelIndex, role: int = Qt.ItemDataRole.DisplayRole):
        if not index.isValid():
            return None
        m = self.models[index.row()]
        col = index.column()
        if role == ModelRole:
            return m
        if role == Qt.ItemDataRole.DisplayRole:
            return [
                m.get("id", ""),
                m.get("architecture") or "—",
                human_count(m.get("num_params")),
                m.get("format") or "—",
                m.get("quantization") or m.get("dtype") or "—",
                human_bytes(m.get("size_bytes")),
                f"{m['context_length']:,}" if m.get("context_length") else "—",
                fit_hint(m, self.vram_total_bytes, self.gpu_share, self.no_gpu)[0],
            ][col]
        if role == Qt.ItemDataRole.ForegroundRole and col == 7:
            return QColor(fit_hint(m, self.vram_total_bytes, self.gpu_share, self.no_gpu)[1])
        if role == Qt.ItemDataRole.ToolTipRole:
            tip = [display_name(m), m.get("path", ""), f"source: {m.get('source', '?')}"]
            if m.get("memory_estimate_bytes"):
                tip.append(f"needs about {human_bytes(m['memory_estimate_bytes'])} of GPU memory")
            return "\n".join(t for t in tip if t)
        return None

    def set_models(self, models: list[dict]) -> None:
        self.beginResetModel()
        self.models = [m for m in models if isinstance(m, dict)]
        self.endResetModel()

    def set_vram(self, total_bytes: int | None, gpu_share: float | None = None, no_gpu: bool = False) -> None:
        self.vram_total_bytes = total_bytes
        self.no_gpu = no_gpu
        if gpu_share is not None:
            self.gpu_share = gpu_share
        if self.models:
            self.dataChanged.emit(self.index(0, 7), self.index(len(self.models) - 1, 7))

    def ids(self) -> list[str]:
        return [m.get("id", "") for m in self.models if m.get("id")]

    def total_bytes(self) -> int:
        return sum(int(m.get("size_bytes") or 0) for m in self.models)


def picker_details(model: dict) -> str:
    """The chat picker's second line: parameters, quantization, size on disk, context ("1.5B · Q4_K_M ·
    940.0 MiB · 32,768 ctx"); what the listing does not say is left out."""
    parts = []
    if model.get("num_params"):
        parts.append(human_count(model["num_params"]))
    quant = model.get("quantization") or model.get("dtype")
    if quant:
        parts.append(str(quant))
    if model.get("size_bytes"):
        parts.append(human_bytes(model["size_bytes"]))
    if model.get("context_length"):
        parts.append(f"{int(model['context_length']):,} ctx")
    return " · ".join(parts)


def is_model_file(text: str) -> bool:
    """A model chosen by its file on disk (Browse…), not by a `models list` id."""
    return text.lower().endswith(".gguf") and ("/" in text or "\\" in text)
