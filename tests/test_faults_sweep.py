"""Every command-line option swept with bad values (issue 40): empty, zero, negative, huge, non-ASCII
digits, a wrong file type, a missing file, a folder, a symlink loop. Each must give one clear `Error:`
line (exit 1 or 2), leave nothing behind, and never a traceback, an internal error, a hang or a run
that goes on with a silently wrong value.

The cases are made from the command line itself (click's parameters of every command, walked at
collection): each int option gets values outside its range and values that are not ASCII integers,
each choice an unknown name, each float range NaN and values outside it; options read as text get the
bad values of their kind (a list of ints, a context, a model, an input file, an output path). Nothing
slow may start: loading a model, starting a process or a server fails the test (the value was not
checked up front).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import click
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from fault_helpers import error_lines  # noqa: E402

from gatherlens.cli import main  # noqa: E402
from gatherlens.params import Int  # noqa: E402

# what each command needs besides the option under test to reach its checks
BASE = {"generate": ["hi"], "gather": ["--shape", "4,5", "--index", "[[1,2]]"], "bench page": ["{ok_json}"],
        "bench presets": ["{gguf}"]}
SKIP = {"cache list", "cache clear"}           # no options
NOT_INTS = ["", "²", "٣", "1_0", "+4", "1.5", "0x10", "4K", "9" * 40]
TEXT_INPUTS = {"missing": "{tmp}/no-such.txt", "folder": "{tmp}/a-folder", "dev-null": "/dev/null",
               "symlink-loop": "{tmp}/loop", "empty": "{tmp}/empty.txt", "not-utf8": "{tmp}/latin1.txt"}
OUTPUTS = {"a-folder": "{tmp}/a-folder", "under-a-file": "{tmp}/a-file/x", "missing-folder": "{tmp}/no/x",
           "symlink-loop": "{tmp}/loop"}
FOLDERS = {"a-file": "{tmp}/a-file", "under-a-file": "{tmp}/a-file/x", "symlink-loop": "{tmp}/loop"}
# an option that is a folder to write into, not a file (a missing or empty folder is fine there)
FOLDER_OPTIONS = {("explain", "--out"), ("dist demo", "--out"), ("eval-sparse", "--pictures")}
MODELS = {"empty-name": "", "unknown": "no-such-model", "folder-without-config": "{tmp}/a-folder",
          "text-file": "{tmp}/a-file", "symlink-loop": "{tmp}/loop", "empty-gguf": "{tmp}/empty.gguf",
          "not-gguf": "{tmp}/text.gguf"}
INT_LISTS = ["", ",", "0", "-1", "a", "²", "8,,x", "1_0", "9" * 40]
CONTEXTS = ["", "0", "-4K", "4Q", "²K", "K", "9" * 40 + "K"]
# text options by name -> their bad values (every text option of every command must be listed here)
TEXT_OPTIONS = {
    "--model": MODELS, "--gguf": MODELS, "--text": TEXT_INPUTS, "--file": TEXT_INPUTS, "--notes": TEXT_INPUTS,
    "--json": OUTPUTS, "--csv": OUTPUTS, "--pages": OUTPUTS, "--plot": OUTPUTS, "--out": OUTPUTS,
    "-o/--out": OUTPUTS, "--profile": OUTPUTS,
    "--context": CONTEXTS, "--budgets": INT_LISTS, "--compare": INT_LISTS + ["512"], "-k/--top-k": INT_LISTS,
    "--top-k": INT_LISTS, "--vocab": INT_LISTS, "--dim": INT_LISTS, "--tokens": INT_LISTS, "--threads": INT_LISTS,
    "--ids": ["", "a", "²", "1.5"], "--rows": INT_LISTS,
    "--corpus": ["", "nope", "austen:no-such-book"], "--kv-dtype": ["", "int4", "float16,nope"],
    "--rules": ["", "nope"], "--backends": ["", "nope"], "--dtype": ["", "int8x"], "--methods": ["", "nope"],
    "--backward-methods": ["nope"], "--shapes": ["", "nope"], "--routes": ["", "nope"], "--head-routes": ["nope"],
    "--qtype": ["", "Q9_9"], "--tensor": ["", "no.such.tensor"], "--host": ["", "999.1.1.1", "example.invalid"],
    "--llama-python": ["{tmp}/no-such-python", "{tmp}/a-folder"],
    "--shape": ["", "4,", "a,b", "-1,5", "0,5"], "--index": ["", "[[", "[[9,9]]", "[[-9]]"],
    "--values": ["", "[[1,2"], "--labels": ["a,b,c,d,e,f,g"],
    "--system": [],                                   # any text is a system prompt
    "--api-key": ["", "  "],
    "--reference": TEXT_INPUTS,
    "--lengths": INT_LISTS, "--tasks": ["", "nope"], "--records": OUTPUTS, "--from": TEXT_INPUTS,   # eval-long
}
TEXT_ARGUMENTS = {"text": ["", " "], "prompt": ["", "   "], "files": TEXT_INPUTS}


def _commands(group: click.Group, path: tuple[str, ...] = ()):
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))
        else:
            yield " ".join((*path, name)), command


def _int_values(t: Int) -> list[str]:
    out = NOT_INTS[:]
    out += [str(t.lo - 1)] if t.lo is not None else []
    out += [str(t.hi + 1)] if t.hi is not None else []
    return out


def _values(param: click.Parameter, path: str) -> list[tuple[str, str]]:
    """(case id, value) of one parameter's bad values (for command `path`)."""
    t, name = param.type, "/".join(param.opts) if param.opts and isinstance(param, click.Option) else param.name
    if isinstance(param, click.Option) and (path, max(param.opts, key=len)) in FOLDER_OPTIONS:
        return list(FOLDERS.items())
    if isinstance(t, click.types.BoolParamType) or getattr(param, "is_flag", False):
        return []
    if isinstance(t, Int):
        return [(v or "empty", v) for v in _int_values(t)]
    if isinstance(t, (click.types.IntParamType, click.IntRange)):
        return [("click-int", "٣")]                  # a plain click int: should be the one rule (Int)
    if isinstance(t, click.Choice):
        return [("unknown", "no-such-choice"), ("empty", "")]
    if isinstance(t, (click.FloatRange, click.types.FloatParamType)):
        low = getattr(t, "min", None)                # below a range's bottom, where it has one
        outside = [str(low - 1)] if low is not None else []
        return [(v or "empty", v) for v in ("nan", "inf", "abc", "", *outside)]
    table = TEXT_OPTIONS.get(name) or TEXT_OPTIONS.get(max(param.opts, key=len)) if isinstance(param, click.Option) \
        else TEXT_ARGUMENTS.get(param.name)
    if table is None:
        return [("unlisted", None)]                  # a text option without bad values: listed, or a failure
    return list(table.items()) if isinstance(table, dict) else [(v or "empty", v) for v in table]


def _cases():
    for path, command in _commands(main):
        if path in SKIP:
            continue
        for param in command.params:
            for case, value in _values(param, path):
                flag = max(param.opts, key=len) if isinstance(param, click.Option) else None
                yield pytest.param(path, flag, param.name, value, id=f"{path}|{flag or param.name}|{case}")


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """A folder of the inputs the cases name, as the working directory; nothing slow can start."""
    import gatherlens.models
    import uvicorn

    (tmp_path / "a-folder").mkdir()
    (tmp_path / "a-file").write_text("mine")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 na\xefve".encode("latin-1"))
    (tmp_path / "empty.gguf").write_bytes(b"")
    (tmp_path / "text.gguf").write_text("not a gguf")
    (tmp_path / "ok.json").write_text('{"suite": "decode", "meta": {}, "rows": []}')

    def started(*a, **k):
        raise AssertionError("slow work started: the bad value was not checked up front")

    monkeypatch.setattr(gatherlens.models, "load", started)
    monkeypatch.setattr(subprocess, "run", started)
    monkeypatch.setattr(subprocess, "Popen", started)
    monkeypatch.setattr(uvicorn, "run", started)
    monkeypatch.setattr("gatherlens.dist.launch.run_ranks", started)
    monkeypatch.setattr("gatherlens.bench.fresh.run_fresh", started)
    monkeypatch.setattr("gatherlens.bench.fresh.run_script", started)
    for name in ("call_seconds", "sample_seconds", "round_robin"):      # benchmarks timed in this process
        monkeypatch.setattr(f"gatherlens.bench.timing.{name}", started)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("path,flag,name,value", list(_cases()))
def test_a_bad_value_is_one_error_line_and_leaves_nothing(sandbox, path, flag, name, value):
    """Must hold: exit 1 or 2, exactly one `Error:` line, no traceback or internal error, no file made,
    no slow work started (a model load, a process, a server)."""
    from click.testing import CliRunner

    assert value is not None, f"{flag or name} of `{path}` is a text option without bad values in TEXT_OPTIONS"
    from fault_helpers import smollm2_path

    fill = {"tmp": str(sandbox), "ok_json": str(sandbox / "ok.json")}
    if "{gguf}" in " ".join(BASE.get(path, [])):
        fill["gguf"] = str(smollm2_path())
    value = value.format(**fill)
    base = [a.format(**fill) for a in BASE.get(path, [])]
    if flag is None:                              # an argument: it replaces the base's
        base = [value]
        args = [*path.split(), *base]
    else:
        args = [*path.split(), *base, flag, value]
    before = sorted(p.name for p in sandbox.iterdir())
    result = CliRunner().invoke(main, args)
    out = result.output
    assert "Traceback" not in out and "internal error" not in out, out
    assert not isinstance(result.exception, AssertionError), f"{args}: {result.exception}"
    assert result.exit_code in (1, 2), f"{args} gave exit {result.exit_code}:\n{out}"
    assert len(error_lines(result)) == 1, f"{args}:\n{out}"
    assert sorted(p.name for p in sandbox.iterdir()) == before, f"{args} left files"
    assert not any(p.name.startswith(".gatherlens") for p in Path(os.getcwd()).rglob(".*") if p.is_dir())
