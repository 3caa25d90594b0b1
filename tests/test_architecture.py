"""The layout shows the architecture: imports flow one way, functions stay short, privates stay private.

Layers, lowest first (docs/architecture.md): errors/drawable -> ops -> trace -> render -> the edge
(models, eval, report, bench, dist, serve, commands, cli). A module may import its own layer and
those below it, never one above, not even inside a function.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "gatherlens"
MAX_LINES = 60

# layer of each top-level part of the package; a module may import only parts of rank <= its own
RANK = {
    "errors": 0, "drawable": 0, "i18n": 0, "_version": 0, "outputs": 0,
    "ops": 1,
    "trace": 2,
    "render": 3,
    "models": 4, "eval": 5, "report": 5, "bench": 5, "dist": 5,
    "serve": 6, "commands": 7, "cli": 8, "__main__": 9, "__init__": 9,
}
# the one door from below into render: drawable.draw_lazily imports render when a picture is asked for
DOORS = {("drawable", "render")}


def _modules():
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC)
        yield rel, ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _part(rel: Path) -> str:
    return rel.parts[0].removesuffix(".py")


def _imported_parts(tree: ast.AST, rel: Path):
    pkg = list(rel.parts[:-1])
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[: len(pkg) - node.level + 1]
                names = [".".join(["gatherlens", *base, node.module or ""]).rstrip(".")]
            else:
                names = [node.module or ""]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "gatherlens" and len(parts) > 1:
                yield node.lineno, parts[1]


def _cases():
    return [pytest.param(rel, tree, id=str(rel)) for rel, tree in _modules()]


@pytest.mark.parametrize("rel,tree", _cases())
def test_imports_flow_downwards(rel, tree):
    mine = _part(rel)
    if mine not in RANK:
        pytest.fail(f"{rel}: top-level part {mine!r} has no layer in tests/test_architecture.py RANK")
    for line, other in _imported_parts(tree, rel):
        if (mine, other) in DOORS:
            continue
        assert RANK.get(other, 99) <= RANK[mine], f"{rel}:{line} ({mine}) imports gatherlens.{other}, a higher layer"


@pytest.mark.parametrize("rel,tree", _cases())
def test_functions_are_short(rel, tree):
    long = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            kernel = any(getattr(d, "attr", getattr(d, "id", "")) in {"jit", "autotune"}
                         or (isinstance(d, ast.Call) and getattr(d.func, "attr", "") in {"jit", "autotune"})
                         for d in node.decorator_list)
            n = node.end_lineno - node.lineno + 1
            if n > MAX_LINES and not kernel:
                long.append(f"{node.name} ({n} lines, line {node.lineno})")
    assert not long, f"{rel}: functions over {MAX_LINES} lines: {', '.join(long)}"


@pytest.mark.parametrize("rel,tree", _cases())
def test_no_private_names_of_other_modules(rel, tree):
    """`from gatherlens.x import _name` (or a relative one) reaches into another module."""
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("gatherlens")):
            bad += [f"line {node.lineno}: from {node.module or '.'} import {a.name}" for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")]
    assert not bad, f"{rel}: " + "; ".join(bad)


def _private_attributes_by_module():
    """{module path: names it stores as `self._name`}: the private state each module owns."""
    owned: dict[Path, set[str]] = {}
    for rel, tree in _modules():
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                    and isinstance(node.value, ast.Name) and node.value.id == "self"
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                owned.setdefault(rel, set()).add(node.attr)
    return owned


def test_no_module_reads_another_modules_private_attributes():
    owned = _private_attributes_by_module()
    offenders = []
    for rel, tree in _modules():
        others = set().union(*(names for path, names in owned.items() if path != rel)) - owned.get(rel, set())
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr in others
                    and not (isinstance(node.value, ast.Name) and node.value.id in {"self", "cls"})):
                offenders.append(f"{rel}:{node.lineno} .{node.attr}")
    assert not offenders, "reads of another module's private attributes: " + ", ".join(offenders)


def _cycles():
    graph: dict[str, set[str]] = {}
    for rel, tree in _modules():
        name = ".".join(("gatherlens", *rel.with_suffix("").parts)).removesuffix(".__init__")
        deps = set()
        for node in tree.body:  # import-time edges only: the ones that can form a circle at load
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = list(rel.parts[:-1])[: len(rel.parts) - 1 - node.level + 1]
                    mod = ".".join(["gatherlens", *base, *(node.module.split(".") if node.module else [])])
                else:
                    mod = node.module or ""
                deps.add(mod)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
        graph[name] = {d for d in deps if d.startswith("gatherlens")}
    return graph


def test_no_import_cycles_between_modules():
    graph = _cycles()
    known = set(graph)

    def resolve(dep):  # "gatherlens.ops.sparse" is a package: its __init__ is the node
        return dep if dep in known else None

    seen, stack, cycles = set(), [], []

    def visit(node):
        if node in stack:
            cycles.append(stack[stack.index(node):] + [node])
            return
        if node in seen:
            return
        seen.add(node)
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            target = resolve(dep)
            if target and not node.startswith(target + "."):  # a module importing its own package is fine
                visit(target)
        stack.pop()

    for node in sorted(graph):
        visit(node)
    assert not cycles, "import cycles: " + " | ".join(" -> ".join(c) for c in cycles[:5])
