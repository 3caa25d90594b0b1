"""The layout shows the architecture: imports flow one way, functions stay short, privates stay private.

Layers, lowest first (docs/architecture.md): errors/drawable -> ops -> trace -> render -> the edge
(models, eval, report, bench, dist, serve, commands, cli). A module may import its own layer and
those below it, never one above, not even inside a function.
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "gatherlens"
MAX_LINES = 60

# layer of each top-level part of the package; a module may import only parts of rank <= its own
RANK = {
    "errors": 0, "drawable": 0, "i18n": 0, "_version": 0, "outputs": 0, "paths": 0, "lazy": 0, "params": 0, "filelock": 0, "memory": 0,
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
        for node in ast.walk(tree):  # lazy (in-function) imports too: a circle is a circle whenever it closes
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = list(rel.parts[:-1])[: len(rel.parts) - 1 - node.level + 1]
                    mod = ".".join(["gatherlens", *base, *(node.module.split(".") if node.module else [])])
                else:
                    mod = node.module or ""
                deps.add(mod)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
        door = {f"gatherlens.{b}" for a, b in DOORS if rel.parts[0].removesuffix(".py") == a}  # the lazy door
        graph[name] = {d for d in deps if d.startswith("gatherlens")
                       and not any(d == x or d.startswith(x + ".") for x in door)}
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


# models/ by concern, lowest first (docs/architecture.md): a package may import its own rank and below,
# lazily or not; the loader (loading.py) sits above the GGUF reader so the two never import each other
MODELS_RANK = {"hf_adapter": 0, "files": 1, "gguf": 2, "attention": 3, "loading": 4, "runtime": 5, "__init__": 9}
MODELS_TOP_LEVEL_MAX = 12


def _models_part(rel: Path) -> str | None:
    return rel.parts[1].removesuffix(".py") if rel.parts[0] == "models" and len(rel.parts) > 1 else None


def _imported_models_parts(tree: ast.AST, rel: Path):
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("gatherlens.models"):
            parts = node.module.split(".")
            names = [parts[2]] if len(parts) > 2 else [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name.split(".")[2] for a in node.names if a.name.startswith("gatherlens.models.")]
        else:
            continue
        yield from ((node.lineno, n) for n in names if n in MODELS_RANK)


@pytest.mark.parametrize("rel,tree", [c for c in _cases() if c.values[0].parts[0] == "models"])
def test_models_packages_import_downwards(rel, tree):
    mine = _models_part(rel)
    assert mine in MODELS_RANK, f"{rel}: models/{mine} has no rank in tests/test_architecture.py MODELS_RANK"
    for line, other in _imported_models_parts(tree, rel):
        assert MODELS_RANK[other] <= MODELS_RANK[mine], \
            f"{rel}:{line} (models/{mine}) imports models/{other}, a higher part of models/"


def test_models_has_few_top_level_modules():
    top = sorted(p.name for p in (SRC / "models").glob("*.py"))
    assert len(top) <= MODELS_TOP_LEVEL_MAX, f"models/ holds {len(top)} top-level modules: {top}; group them by concern"


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


import re  # noqa: E402  (the JavaScript rule below; kept with it)

TEMPLATES = SRC / "render" / "templates"  # the explorer's scripts: the 60-line rule holds for JavaScript too
_JS_REGEX_AFTER = set("(,=:[!&|?{};+-*%<>~^")  # a `/` after one of these (or a word below) opens a regex
_JS_REGEX_WORDS = {"return", "typeof", "case", "in", "of", "new", "delete", "void", "throw", "instanceof"}
_JS_FUNCTION = re.compile(
    r"\bfunction\s*\*?\s*(?P<declared>[A-Za-z_$][\w$]*)\s*\("                               # function f(
    r"|(?P<assigned>[A-Za-z_$][\w$.]*)\s*[=:]\s*(?:async\s+)?function\b\s*\*?\s*\("        # x.f = function (
    r"|\b(?:const|let|var)\s+(?P<arrow>[A-Za-z_$][\w$]*)\s*=\s*(?:async\s+)?"
    r"(?:\([^()]*\)|[A-Za-z_$][\w$]*)\s*=>\s*(?=\{)"                                        # const f = (a) => {
    r"|^[ \t]*(?:(?:async|static|get|set)\s+)*(?P<method>[A-Za-z_$][\w$]*)\s*\([^()]*\)\s*(?=\{)",  # m(a) {
    re.M)
_JS_NOT_METHODS = {"if", "for", "while", "switch", "catch", "function", "return", "with"}


def _blank(text: str) -> str:
    return re.sub(r"[^\n]", " ", text)


def _js_regex_opens(out: list) -> bool:
    """Whether a `/` after the code so far (`out`) opens a regex literal rather than divides."""
    code = "".join(out[-40:]).rstrip() or "".join(out).rstrip()
    word = re.search(r"[\w$]+$", code)
    return not code or code[-1] in _JS_REGEX_AFTER or (word is not None and word.group() in _JS_REGEX_WORDS)


def _js_code(text: str) -> str:
    """`text` with the insides of strings, template literals (not their `${}`), regexes and comments blanked."""
    out, i, n, depths = [], 0, len(text), [0]  # depths: brace depth of the code, then of each open `${`
    while i < n:
        c = text[i]
        if text.startswith(("//", "/*"), i):
            end = text.find("\n" if text[i + 1] == "/" else "*/", i + 2)
            j = n if end < 0 else end + (0 if text[i + 1] == "/" else 2)
        elif c in "'\"":
            j = i + 1
            while j < n and text[j] not in (c, "\n"):
                j += 2 if text[j] == "\\" else 1
            out.append(c + _blank(text[i + 1:j]) + c)
            i = j + 1
            continue
        elif c == "`" or (c == "}" and len(depths) > 1 and depths[-1] == 0):  # template text, to `${` or "`"
            if c == "}":
                depths.pop()
            j = i + 1
            while j < n and text[j] != "`" and not text.startswith("${", j):
                j += 2 if text[j] == "\\" else 1
            opens = text.startswith("${", j)
            depths += [0] if opens else []
            out.append(c + _blank(text[i + 1:j]) + ("${" if opens else "`"))
            i = j + (2 if opens else 1)
            continue
        elif c == "/" and _js_regex_opens(out):
            j, in_class = i + 1, False
            while j < n and text[j] != "\n" and (in_class or text[j] != "/"):
                in_class = text[j] == "[" or (in_class and text[j] != "]")
                j += 2 if text[j] == "\\" else 1
            j += 1
            while j < n and text[j].isalpha():
                j += 1
        else:
            depths[-1] += {"{": 1, "}": -1}.get(c, 0)
            out.append(c)
            i += 1
            continue
        out.append(_blank(text[i:j]))
        i = j
    return "".join(out)


def _js_matching(code: str, start: int, pair: str) -> int:
    """The index of the bracket that closes the one at `start` (pair: "()" or "{}")."""
    depth = 0
    for j in range(start, len(code)):
        depth += {pair[0]: 1, pair[1]: -1}.get(code[j], 0)
        if depth == 0:
            return j
    return len(code) - 1


def _js_functions(text: str):
    """(name, first line, lines) of each named function, `x.f = function`, `const f = () => {` and method."""
    code = _js_code(text)
    for m in _JS_FUNCTION.finditer(code):
        kind, name = next((k, v) for k, v in m.groupdict().items() if v)
        if kind == "method" and name in _JS_NOT_METHODS:
            continue
        after = _js_matching(code, m.end() - 1, "()") if code[m.end() - 1] == "(" else m.end()
        end = _js_matching(code, code.find("{", after), "{}")
        first = code.count("\n", 0, m.start(kind)) + 1
        yield name, first, code.count("\n", 0, end) + 2 - first


def test_js_measure_skips_strings_regexes_and_comments():
    text = ("function a(x) {\n  var s = '{', t = `${x + '}'} {`, r = /\\{(\\w+)\\}/g; // }\n"
            "  /* { */ return x / 2;\n}\nconst b = (y) => {\n  return {y: y};\n};\n"
            "A.prototype.c = function () { return \"}\"; };\n")
    assert list(_js_functions(text)) == [("a", 1, 4), ("b", 5, 3), ("A.prototype.c", 8, 1)]


def test_js_functions_are_short():
    """The explorer's scripts (render/templates/*.js) keep the 60-line rule of the Python."""
    scripts = sorted(TEMPLATES.glob("*.js"))
    assert scripts, f"no JavaScript under {TEMPLATES}"
    long = [f"{path.name}: {name} ({n} lines, line {line})" for path in scripts
            for name, line, n in _js_functions(path.read_text(encoding="utf-8")) if n > MAX_LINES]
    assert not long, f"JavaScript functions over {MAX_LINES} lines: {', '.join(long)}"


# -- transformers internals: only the adapter touches them --------------------------------------
HF_ADAPTER = Path("models") / "hf_adapter.py"  # the one module allowed to touch transformers internals
# private names of transformers objects, flagged whatever object they are read on
HF_PRIVATE = {"_attn_implementation", "_attn_implementation_internal", "_prepare_cache_for_generation",
              "_supports_default_dynamic_cache", "_is_user_defined", "_global_mapping", "_local_mapping",
              "_from_config", "_check_and_adjust_attn_implementation", "_prepare_static_cache",
              "_update_model_kwargs_for_generation", "_no_split_modules", "_tied_weights_keys"}
# torch's private names gatherlens relies on where they belong (ops/: torch's packed-weight kernels;
# Tensor._version: its in-place write counter): third-party, but not transformers
TORCH_PRIVATE = {"_version"}
PUBLIC_HF_SUBMODULES = {"logging"}  # `transformers.logging` is a top-level export


def _gatherlens_private_names() -> set[str]:
    """Private names gatherlens defines itself (functions, methods, `self._x` state, module constants)."""
    names = set()
    for _, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return {n for n in names if n.startswith("_") and not n.startswith("__")} - HF_PRIVATE


def _root(node: ast.AST) -> str:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else ""


def _is_type_name(node: ast.AST, names: set[str]) -> bool:
    """`type(x).__name__`, `x.__class__.__name__`, or a local name assigned from one."""
    if isinstance(node, ast.Name):
        return node.id in names
    return (isinstance(node, ast.Attribute) and node.attr == "__name__"
            and ((isinstance(node.value, ast.Call) and getattr(node.value.func, "id", "") == "type")
                 or (isinstance(node.value, ast.Attribute) and node.value.attr == "__class__")))


def _private_touch(node: ast.AST, ours: set[str]) -> str | None:
    """The private attribute a node reads or writes on a foreign object, or None."""
    if isinstance(node, ast.Attribute):
        name, root = node.attr, _root(node)
    elif (isinstance(node, ast.Call) and getattr(node.func, "id", "") in {"getattr", "hasattr", "setattr", "delattr"}
          and len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
          and node.args[1].value not in HF_PRIVATE):  # those: the constant itself, below
        name, root = node.args[1].value, _root(node.args[0])
    elif isinstance(node, ast.Constant) and node.value in HF_PRIVATE:
        return f"{node.value!r}"
    else:
        return None
    if not name.startswith("_") or name.startswith("__") or root in {"self", "cls"}:
        return None
    if name in HF_PRIVATE or (root != "torch" and name not in ours and name not in TORCH_PRIVATE):
        return f"{root}...{name}"
    return None


def _import_touch(node: ast.AST) -> str | None:
    """An import of a transformers submodule or private name, or `transformers.<submodule>`."""
    if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "transformers":
        if node.module != "transformers":
            return f"from {node.module} import ..."
        private = [a.name for a in node.names if a.name.startswith("_")]
        return f"from transformers import {', '.join(private)}" if private else None
    if isinstance(node, ast.Import):
        sub = [a.name for a in node.names if a.name.startswith("transformers.")]
        return f"import {', '.join(sub)}" if sub else None
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "transformers"
            and node.attr.islower() and not node.attr.startswith("__") and node.attr not in PUBLIC_HF_SUBMODULES):
        return f"transformers.{node.attr}"
    return None


def _forward_touch(node: ast.AST) -> str | None:
    """A per-instance `forward` replaced, or looked up / removed in an instance's __dict__."""
    if isinstance(node, ast.Attribute) and node.attr == "forward" and isinstance(node.ctx, ast.Store):
        return f"{ast.unparse(node)} = ..."
    if (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "setattr" and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant) and node.args[1].value == "forward"):
        return "setattr(..., 'forward', ...)"
    if isinstance(node, (ast.Call, ast.Compare)):
        parts = [node.func, *node.args] if isinstance(node, ast.Call) else [node.left, *node.comparators]
        on_dict = any(isinstance(p, ast.Attribute) and p.attr == "__dict__" or
                      (isinstance(p, ast.Attribute) and isinstance(p.value, ast.Attribute) and p.value.attr == "__dict__")
                      for p in parts)
        key = any(isinstance(p, ast.Constant) and p.value == "forward" for p in parts)
        return "'forward' in an instance __dict__" if on_dict and key else None
    return None


def _class_name_touch(node: ast.AST, names: set[str]) -> str | None:
    """A check of a class by its name: `type(x).__name__ in (...)`, `.endswith(...)`, `== "..."`."""
    if isinstance(node, ast.Compare) and any(_is_type_name(p, names) for p in [node.left, *node.comparators]):
        return ast.unparse(node)[:60]
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in {"startswith", "endswith"} and _is_type_name(node.func.value, names)):
        return ast.unparse(node)[:60]
    return None


def _kwargs_touch(node: ast.AST, params: set[str]) -> str | None:
    """A cache handing something to the attention call through its kwargs dict (write or read)."""
    if (isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store) and isinstance(node.value, ast.Name)
            and node.value.id in params):
        return f"{ast.unparse(node)} = ..."
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in {"pop", "get"}
            and getattr(node.func.value, "id", "") == "kwargs" and node.args
            and getattr(node.args[0], "id", "").endswith("KWARG")):
        return ast.unparse(node)
    return None


def _type_name_locals(func: ast.AST) -> set[str]:
    return {t.id for n in ast.walk(func) if isinstance(n, ast.Assign) and _is_type_name(n.value, set())
            for t in n.targets if isinstance(t, ast.Name)}


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}


def transformers_touches(tree: ast.AST, ours: set[str]) -> list[tuple[int, str, str]]:
    """(line, kind, what) for every touch of a transformers internal in a module (see HF_ADAPTER)."""
    docs, context = _docstrings(tree), {}
    for func in ast.walk(tree):  # outer functions first: an inner one's context overrides
        if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            ctx = ({a.arg for a in func.args.args + func.args.kwonlyargs} & {"kwargs"}, _type_name_locals(func))
            context.update((id(n), ctx) for n in ast.walk(func))
    found = set()
    for node in ast.walk(tree):
        if id(node) in docs:
            continue
        params, names = context.get(id(node), (set(), set()))
        for kind, what in (("private attribute", _private_touch(node, ours)), ("private import", _import_touch(node)),
                           ("forward replaced", _forward_touch(node)), ("class-name check", _class_name_touch(node, names)),
                           ("kwargs handoff", _kwargs_touch(node, params))):
            if what:
                found.add((node.lineno, kind, what))
    return sorted(found)


@functools.cache  # one scan a session: tests/test_hf_adapter.py lists the same touches
def transformers_touches_by_module() -> dict[Path, list[tuple[int, str, str]]]:
    """{module path: its touches of transformers internals} for every module of the package that has any."""
    ours = _gatherlens_private_names()
    return {rel: found for rel, tree in _modules() if (found := transformers_touches(tree, ours))}


def test_transformers_internals_only_in_the_adapter():
    """Private attributes of third-party objects, transformers submodules, per-instance forwards, class-name
    checks and kwargs hand-overs: only models/hf_adapter.py (tests/test_hf_adapter.py lists its touches)."""
    outside = [f"{rel}:{line} [{kind}] {what}" for rel, found in transformers_touches_by_module().items()
               if rel != HF_ADAPTER for line, kind, what in found]
    assert not outside, "touches of transformers internals outside models/hf_adapter.py (add a named function " \
                        "there and call it): " + "; ".join(outside)


# ---- C++: the same short-function rule, for every kernel source and header under src/ ----

_CPP_NOISE = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|^[ \t]*#[^\n]*', re.S | re.M)
_CPP_NOT_FUNCTIONS = re.compile(r"^(?:template\s*<.*>\s*)?(?:namespace|struct|class|union|enum|if|for|while|switch|do|else)\b")


def cpp_function_lengths(text: str) -> list[tuple[str, int, int]]:
    """[(name, lines, first line)] of every function defined in C++ `text` (lambdas and blocks inside a
    body count towards it): a brace-matching scan with comments, strings and preprocessor lines blanked."""
    code = _CPP_NOISE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
    found, stack, mark = [], [], 0  # stack: (is a function, name, first line) per open brace
    for i, ch in enumerate(code):
        if ch == "{":
            head = code[mark:i]
            call = re.search(r"([A-Za-z_~][\w:~]*)\s*\(", head)
            fn = (call is not None and not any(f for f, _, _ in stack) and "=" not in head[:call.start()]
                  and not _CPP_NOT_FUNCTIONS.match(" ".join(head.split())))
            stack.append((fn, call.group(1) if fn else "", code.count("\n", 0, mark + call.start()) + 1 if fn else 0))
        elif ch == "}" and stack:
            fn, name, first = stack.pop()
            if fn:
                found.append((name, code.count("\n", 0, i) + 2 - first, first))
        if ch in ";{}":
            mark = i + 1
    return found


def test_cpp_functions_are_short():
    assert cpp_function_lengths("int f(int a) {\n  if (a) { return 1; }\n  return 0;\n}\n") == [("f", 4, 1)]
    long = [f"{path.relative_to(SRC)}: {name} ({n} lines, line {line})"
            for path in sorted(p for p in SRC.rglob("*") if p.suffix in (".cpp", ".h"))
            for name, n, line in cpp_function_lengths(path.read_text(encoding="utf-8")) if n > MAX_LINES]
    assert not long, f"C++ functions over {MAX_LINES} lines: {'; '.join(long)}"
