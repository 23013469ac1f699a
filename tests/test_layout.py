"""The package layout shows the architecture: no import circle in refimpl/ or kernels/, and the arrows between
folders run one way, in the order each package's ``__init__`` states.

Every ``import`` counts, wherever it stands: at module level, inside a function (a lazy import is still a
dependency) and under ``if TYPE_CHECKING:``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Folders from the bottom up: a module may import only from its own folder or from folders before it.
# (refimpl.errors is the one module every folder shares; kernels sits below all of refimpl.)
ORDER = {
    "kernels": ["kernels.base", "kernels.plain", "kernels.lanes", "kernels.ggml", "kernels"],
    # the version first; the Python API (refimpl.api) and the package top that exports it (refimpl/__init__.py)
    # above everything, python -m refimpl last
    # refimpl.graph (llama.cpp's graph, --emulate=ggml) sits below refimpl.model (the reference), whose forward
    # passes hand it a Ctx(ggml=…): the graph never imports the reference it is tested against
    "refimpl": ["refimpl.version", "refimpl.errors", "refimpl.io", "refimpl.tokenizer", "refimpl.fixtures", "refimpl.graph",
                "refimpl.model", "refimpl.decode", "refimpl.oracle", "refimpl.inject", "refimpl.cli", "refimpl.api", "refimpl",
                "refimpl.__main__"],
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(package: str) -> dict[str, Path]:
    return {module_name(p): p for p in sorted((ROOT / package).rglob("*.py")) if "__pycache__" not in p.parts}


ALL = {**modules("refimpl"), **modules("kernels")}


def imports_of(name: str, path: Path) -> set[str]:
    """The refimpl / kernels modules that ``name`` imports, anywhere in its file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # ``from pkg import mod`` imports the module pkg.mod; ``from mod import name`` the module mod
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in ALL else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in ALL:  # import a.b.c where only a.b is ours (an attribute path)
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


GRAPH = {name: imports_of(name, path) for name, path in ALL.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components of more than one module (or a module that imports itself)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def folder(name: str) -> str:
    """The ORDER entry a module belongs to: the longest listed prefix. refimpl's package top holds only its
    ``__init__`` (the API's names, above every folder): a module elsewhere under refimpl/ is in a listed folder."""
    top = name.split(".")[0]
    found = [f for f in ORDER[top] if name == f or (name.startswith(f + ".") and f != "refimpl")]
    assert found, f"{name} is in no folder of ORDER (tests/test_layout.py): list its folder there, in dataflow order"
    return max(found, key=len)


def test_the_walker_sees_lazy_and_relative_imports():
    assert "refimpl.io.weights" in GRAPH["refimpl.io.streamer"]
    assert "kernels.base.blocks" in GRAPH["kernels.base.blocks_iq"] or "kernels.base.block" in GRAPH["kernels.base.blocks_iq"]
    assert "kernels.lanes.act" in GRAPH["kernels.ggml.actdots"]  # imported inside a function
    assert "refimpl.oracle.cluster" in GRAPH["refimpl.oracle.golden_run"]  # likewise


def test_the_walker_finds_a_circle():
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("package", ["refimpl", "kernels"])
def test_no_import_circle(package):
    circles = [c for c in strongly_connected(GRAPH) if c[0].split(".")[0] == package]
    assert not circles, "import circles: " + "; ".join(" ↔ ".join(c) for c in circles)


@pytest.mark.parametrize("package", ["refimpl", "kernels"])
def test_arrows_between_folders_run_one_way(package):
    rank = {f: i for i, f in enumerate(ORDER[package])}
    wrong = []
    for name, targets in GRAPH.items():
        if name.split(".")[0] != package:
            continue
        for target in targets:
            if target.split(".")[0] != package:
                assert (package, target.split(".")[0]) == ("refimpl", "kernels"), f"{name} imports {target}"
                continue
            here, there = folder(name), folder(target)
            if here != there and rank[there] > rank[here]:
                wrong.append(f"{name} ({here}) imports {target} ({there})")
    assert not wrong, "imports against the folder order:\n" + "\n".join(sorted(wrong))


def test_every_folder_states_its_contract():
    for package, folders in ORDER.items():
        for f in folders:
            init = ROOT / Path(*f.split(".")) / "__init__.py"
            if init.exists():
                doc = ast.get_docstring(ast.parse(init.read_text()))
                assert doc and "import" in doc, f"{init.relative_to(ROOT)}: its docstring says what the folder may import"
