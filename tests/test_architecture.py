"""The package's shape, as docs/architecture.md draws it: no import circles anywhere in wslm/, and in
wslm/backend each layer imports only its own layer or the ones below it. Read from the source (ast), so a
lazy import inside a function counts as much as one at the top."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "wslm"

# Top to bottom. pooling/ turns a decoder's hidden states into embeddings for LLMEngine (the frontend), so
# it sits below the frontend; the BERT encoder engine, a front end of its own, lives in frontend/. The side
# folders (hub, structured, distributed) and the shared types at backend/ (config, outputs, params,
# sequence, errors) are not ranked but may not import the pipeline's upper half.
LAYERS = [
    ("entrypoints",),
    ("frontend",),
    ("pooling",),
    ("engine",),
    ("executor",),
    ("worker",),
    ("loader",),
    ("platforms",),
    ("modeling",),
    ("quant",),
]
UPPER = {"entrypoints", "frontend", "pooling", "engine", "executor"}
# What the engine hands down a step and gets back, as plain data (vLLM's workers import its scheduler output
# too): every layer may import these, and they import only the shared types (and each other).
INTERFACES = {"wslm.backend.engine.scheduler_output", "wslm.backend.engine.step_inputs"}


def _modules() -> dict[str, Path]:
    mods = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for target in targets:
                while target and target not in mods:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    deps.add(target)
        graph[name] = deps
    return graph


def _layer(module: str) -> int | None:
    parts = module.split(".")
    if parts[:2] != ["wslm", "backend"] or len(parts) < 3:
        return None
    return next((i for i, names in enumerate(LAYERS) if parts[2] in names), None)


def test_no_import_circles():
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                circles.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert circles == []


def test_backend_layers_import_only_downward():
    upward = []
    for module, deps in sorted(_graph().items()):
        if module == "wslm.backend":  # the public API re-exports LLM and LLMEngine (lazily)
            continue
        mine = _layer(module)
        for dep in sorted(deps):
            if dep in INTERFACES:
                continue
            theirs = _layer(dep)
            if mine is not None and theirs is not None and theirs < mine:
                upward.append(f"{module} -> {dep}")
            side = module.startswith("wslm.backend.") and mine is None
            if side and theirs is not None and LAYERS[theirs][0] in UPPER | {"frontend"}:
                upward.append(f"{module} -> {dep}")
    assert upward == []


def test_step_interfaces_import_only_shared_types():
    """The modules every layer may import (INTERFACES) reach no ranked layer or side folder themselves."""
    graph, mods = _graph(), _modules()
    shared = {m for m, path in mods.items() if m.count(".") == 2 and m.startswith("wslm.backend.")
              and path.name != "__init__.py"}  # backend/config.py, sequence.py, ...
    reaching = [f"{m} -> {d}" for m in sorted(INTERFACES) for d in sorted(graph[m])
                if d.startswith("wslm.backend") and d not in INTERFACES | shared]
    assert INTERFACES <= set(mods) and reaching == []


def test_kernels_gui_and_bridge_stay_out_of_the_backend():
    """Kernels sit below everything; the GUI and the Windows bridge reach the backend only through `wslm`
    commands and HTTP (so the Windows side never needs torch)."""
    crossing = [
        f"{m} -> {d}"
        for m, deps in _graph().items()
        if m.startswith(("wslm.kernels", "wslm.gui", "wslm.wsl_bridge"))
        for d in deps
        if d.startswith("wslm.backend")
    ]
    assert crossing == []


def test_test_tooling_is_not_in_the_package():
    names = set(_modules())
    assert not {"wslm.backend.fault_injection", "wslm.kernels.compile_check", "wslm.kernels.testing"} & names
