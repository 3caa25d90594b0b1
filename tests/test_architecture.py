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
    "errors": 0, "drawable": 0, "i18n": 0, "_version": 0, "outputs": 0, "paths": 0, "lazy": 0,
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


@pytest.mark.parametrize("args", [["--help"], ["cache", "list"]], ids=["--help", "cache list"])
def test_light_commands_import_no_torch(args, tmp_path):
    """`gatherlens --help` and `gatherlens cache list` answer without importing torch."""
    import os
    import subprocess
    import sys

    code = ("import sys; from click.testing import CliRunner; from gatherlens.cli import main; "
            f"r = CliRunner().invoke(main, {args!r}); assert r.exit_code == 0, r.output; "
            "print('torch' in sys.modules)")
    env = {**os.environ, "GATHERLENS_CACHE": str(tmp_path)}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "False", f"gatherlens {' '.join(args)} imported torch"


GEOMETRY = Path("ops") / "sparse" / "geometry.py"  # the one home of page-count arithmetic


def _inline_ceil_divisions(tree: ast.AST):
    """Lines of `-(-a // b)` and of local ceil-division helpers (`_cdiv`, `cdiv`) in a module."""
    for node in ast.walk(tree):
        if (isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub)
                and isinstance(node.operand, ast.BinOp) and isinstance(node.operand.op, ast.FloorDiv)
                and isinstance(node.operand.left, ast.UnaryOp) and isinstance(node.operand.left.op, ast.USub)):
            yield node.lineno, "-(-a // b)"
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            name = getattr(node, "name", "")
            if name.lstrip("_") in {"cdiv", "ceil_div", "ceildiv"}:
                yield node.lineno, f"def {name}"


@pytest.mark.parametrize("rel,tree", _cases())
def test_no_inline_page_arithmetic_outside_geometry(rel, tree):
    """Page counts and ceil divisions come from gatherlens.ops.sparse.geometry (ceil_div, page_count, ...)."""
    if rel == GEOMETRY:
        return
    found = [f"{rel}:{line}: {what}" for line, what in _inline_ceil_divisions(tree)]
    assert not found, ("inline ceil division; use gatherlens.ops.sparse.geometry.ceil_div / page_count: "
                       + "; ".join(found))


def _ctypes_imports(tree: ast.AST):
    """Lines that import ctypes (`import ctypes`, `import ctypes.util`, `from ctypes import ...`)."""
    for node in ast.walk(tree):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
        if any(n == "ctypes" or n.startswith("ctypes.") for n in names):
            yield node.lineno


@pytest.mark.parametrize("rel,tree", [c for c in _cases() if c.values[0].parts[0] == "ops"])
def test_no_ctypes_under_ops(rel, tree):
    """Native kernels are PyTorch operators (torch.utils.cpp_extension + torch.library), never ctypes."""
    found = [f"{rel}:{line}" for line in _ctypes_imports(tree)]
    assert not found, "ctypes under ops/ (build with ops/native.py, register with torch.library): " + ", ".join(found)
