"""The command line's own faults: an internal error is one line, bad ints and text files are one
`Error:` line, long inputs are shortened, stop signals during `generate` stop it like Ctrl-C."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from fault_helpers import cpus, error_lines, no_load, run, wait_for  # noqa: E402
from fault_helpers import tiny_dir  # noqa: E402,F401,F811 - fixtures, found by name

from gatherlens.errors import GatherValueError  # noqa: E402


def test_internal_error_is_one_line_and_the_traceback_goes_to_a_file(tmp_path, monkeypatch):
    """Must hold: an unexpected exception prints one line saying where the full traceback is."""
    import gatherlens.models

    def broken(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(gatherlens.models, "load", broken)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    result = run("explain", "hi", "--out", str(tmp_path / "r"))
    assert result.exit_code == 1
    line = result.output.strip().splitlines()[-1]
    assert "internal error (RuntimeError: boom)" in line and "Please report it" in line
    saved = next(tmp_path.glob("gatherlens-error-*.txt")).read_text()
    assert "Traceback" in saved and "RuntimeError: boom" in saved


def test_long_bad_inputs_are_quoted_shortened():
    """Must hold: a 5,000-digit number is echoed as its first 40 characters and '…'."""
    for args in (["gather", "--shape", "4,5", "--index", "[[" + "9" * 5000 + "]]"],
                 ["explain", "hi", "--top-k", "9" * 5000]):
        result = run(*args)
        assert result.exit_code == 2 and "…" in result.output and len(result.output) < 600, result.output


# -- issue 29: one int rule on the command line, text files, kills while writing, stop signals ------


@pytest.mark.parametrize("args, message", [
    (["generate", "hi", "--threads", "999"], "Error: --threads = 999 is outside the valid range [1, {cpus}]"),
    (["generate", "hi", "--threads", "0"], "Error: --threads = 0 is outside the valid range [1, {cpus}]"),
    (["generate", "hi", "--max-new-tokens", "²"],
     "Error: --max-new-tokens = '²' is not an integer; give one in [1, inf)"),
    (["explain", "hi", "--top-k", "٣"], "Error: --top-k = '٣' is not an integer; give one in [1, inf)"),
    (["explain", "hi", "--layer", "1_0"],
     "Error: --layer = '1_0' is not an integer; write it with the digits 0-9 and an optional leading -"),
    (["serve", "--port", "0"], "Error: --port = 0 is outside the valid range [1, 65535]"),
    (["eval", "-k", "8,²"], "Error: -k/--top-k = '8,²' must be comma-separated positive integers: '²' is not an integer; give one "
                            "in [1, inf)"),
    (["lookup", "--ids", "3,+1"], "Error: --ids = '3,+1' must be comma-separated integers: '+1' is not an integer; write it "
                                  "with the digits 0-9 and an optional leading -"),
    (["generate", "--file", "/dev/null"], "Error: text file '/dev/null' is not a regular file (a device, a pipe "
                                          "or a socket); give a UTF-8 text file"),
], ids=["threads-high", "threads-zero", "superscript", "arabic-indic", "underscore", "port", "list", "plus",
        "dev-null"])
def test_cli_ints_and_text_files_are_one_error_line(monkeypatch, args, message):
    """Must hold: every int option is read by gatherlens.params' one rule (ASCII digits, one range
    wording) and --threads stops at this machine's CPUs; /dev/null is named for what it is. One
    `Error:` line, exit 1 or 2, no traceback, before any model loads."""
    no_load(monkeypatch)
    result = run(*args)
    assert result.exit_code in (1, 2), result.output
    assert error_lines(result) == [message.format(cpus=cpus())], result.output


def test_a_text_file_loses_its_byte_order_mark(tmp_path, monkeypatch):
    """Must hold: --file with a UTF-8 BOM gives the model the text without it; an empty file is
    named empty."""
    import gatherlens.commands.generate as generate_command

    seen = {}

    def stop(text, *a, **k):
        seen["text"] = text
        raise GatherValueError("stopped here")

    monkeypatch.setattr(generate_command, "_run", stop)
    (tmp_path / "bom.txt").write_bytes(b"\xef\xbb\xbfIt is a truth")
    result = run("generate", "--file", str(tmp_path / "bom.txt"))
    assert error_lines(result) == ["Error: stopped here"] and seen["text"] == "It is a truth"
    (tmp_path / "empty.txt").write_bytes(b"\xef\xbb\xbf \n")
    result = run("generate", "--file", str(tmp_path / "empty.txt"))
    assert result.exit_code == 1 and error_lines(result) == [f"Error: text file {str(tmp_path / 'empty.txt')!r} is empty"]


SLOW_GENERATE = """
import sys, time, pathlib
import gatherlens.commands.generate as g
ready, real = pathlib.Path(sys.argv[1]), g._write
def slow(piece, result):                    # the real writer, slowed so that a signal lands mid-run
    real(piece, result)
    if len(result.new_ids) >= 3:
        ready.touch()
    time.sleep(0.05)
g._write = slow
from gatherlens.cli import main
main(sys.argv[2:], prog_name="gatherlens")
"""


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP"])
def test_sigterm_during_generate_stops_like_ctrl_c(tiny_dir, tmp_path, signame):
    """Must hold: SIGTERM (kill) or SIGHUP (a closed terminal) during `generate` stops it as Ctrl-C
    does: the continuation so far, the summary naming the signal, --pages written; exit 0."""
    ready, pages = tmp_path / "ready", tmp_path / "pages.svg"
    child = subprocess.Popen([sys.executable, "-c", SLOW_GENERATE, str(ready), "generate", "The cat sat",
                              "--model", str(tiny_dir), "--max-new-tokens", "50", "--pages", str(pages)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(ready, "three generated tokens", timeout=120)
        child.send_signal(getattr(signal, signame))
        out, err = child.communicate(timeout=120)
    finally:
        child.kill()
    assert child.returncode == 0, err
    assert f"stopped ({signame}) after" in err and "Traceback" not in err, err
    assert "wrote" in err and pages.read_text().startswith("<svg")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pages.svg", "ready"]


PHASE_COMMANDS = {
    "generate": ["generate", "The cat sat", "--max-new-tokens", "40", "--pages", "{tmp}/pages.svg"],
    "explain": ["explain", "The cat sat", "--out", "{tmp}/report"],
    "eval": ["eval", "-k", "2", "--tokens", "64", "--text", "{text}", "--out", "{tmp}/q.json"],
}


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.3, 1.5, 4.0, 8.0], ids=["importing", "loading", "running", "late"])
@pytest.mark.parametrize("command", list(PHASE_COMMANDS))
@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_a_signal_at_any_phase_ends_cleanly(tiny_dir, tmp_path, command, delay, signame):
    """Must hold (issue 40): SIGTERM or Ctrl-C at any phase of a command (importing, loading the model,
    running, writing) ends it without a traceback and with at most one `Error:` line (or the summary of
    a stopped `generate`), leaves no temporary file or folder, and any output it leaves is whole."""
    text = tmp_path / "t.txt"
    text.write_text("It is a truth universally acknowledged, that a single man in possession of a good fortune. " * 30)
    work = tmp_path / "work"
    work.mkdir()
    args = [a.format(tmp=work, text=text) for a in PHASE_COMMANDS[command]] + ["--model", str(tiny_dir)]
    child = subprocess.Popen([sys.executable, "-m", "gatherlens", *args], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    time.sleep(delay)
    child.send_signal(getattr(signal, signame))
    try:
        _, err = child.communicate(timeout=180)
    finally:
        child.kill()
    assert "Traceback" not in err and "internal error" not in err, err
    assert len([line for line in err.splitlines() if line.startswith("Error:")]) <= 1, err
    assert child.returncode in (0, 1, -signal.SIGTERM, -signal.SIGINT, 130), (child.returncode, err)
    left = sorted(p.name for p in work.rglob("*"))
    assert not [n for n in left if n.startswith(".gatherlens")], left
    if (work / "pages.svg").exists():
        assert (work / "pages.svg").read_text().rstrip().endswith("</svg>")
    if (work / "report").exists():
        assert {"index.html", "story.json"} <= {p.name for p in (work / "report").iterdir()}
    if (work / "q.json").exists():
        json.loads((work / "q.json").read_text())


def test_a_failure_after_a_stop_signal_reads_as_the_stop_not_an_internal_error(tmp_path, monkeypatch):
    """Must hold (issue 40): a library that a stop signal cut short can fail afterwards with an unrelated
    error (a CI run: Ctrl-C inside transformers' lazy import, swallowed there, then numpy's import looping
    into a RecursionError). Once a stop signal was received, that failure ends the command as the stop
    does ("Aborted!", exit 1), never as an internal error; without one it stays an internal error."""
    from click.testing import CliRunner

    import gatherlens.cli as cli
    import gatherlens.commands.params as params

    (tmp_path / "boom_command.py").write_text(
        "import click\n@click.command()\ndef boom():\n    raise RecursionError('maximum recursion depth exceeded')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cli.COMMANDS, "boom", "boom_command:boom")
    monkeypatch.setattr(params, "RECEIVED", [])
    plain = CliRunner().invoke(cli.main, ["boom"])
    assert plain.exit_code == 1 and "internal error" in plain.output
    monkeypatch.setattr(params, "RECEIVED", ["SIGINT"])
    stopped = CliRunner().invoke(cli.main, ["boom"])
    assert stopped.exit_code == 1 and "Aborted" in stopped.output and "internal error" not in stopped.output
    assert "Traceback" not in stopped.output


_FINALIZER_STOP = """
import os, signal, sys, time
from gatherlens.commands.params import redeliver_swallowed_stop, stop_received
signal.signal(signal.SIGINT, stop_received)
if sys.argv[1] == "hook":
    sys.unraisablehook = redeliver_swallowed_stop
class Finalized:
    def __del__(self):  # the signal lands while a finalizer runs (as it did in a library's __del__ in CI)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
try:
    Finalized()
    for _ in range(200):
        time.sleep(0.01)
    print("finished")
except KeyboardInterrupt:
    print("stopped")
"""


@pytest.mark.parametrize("hook", ["hook", "none"])
def test_a_stop_raised_inside_a_finalizer_is_delivered_again(hook):
    """Must hold (issue 40): Ctrl-C that lands while a library's __del__ runs is not lost there (Python prints it
    as "Exception ignored" and goes on); the command's hook delivers it again outside the finalizer, so the
    command stops, without a traceback. Without the hook (the control) the stop is lost."""
    done = subprocess.run([sys.executable, "-c", _FINALIZER_STOP, hook], capture_output=True, text=True, timeout=60)
    if hook == "hook":
        assert done.stdout.strip() == "stopped" and "Traceback" not in done.stderr, done.stderr
    else:
        assert done.stdout.strip() == "finished" and "Exception ignored" in done.stderr


_IMPORT_STOP = """
import os, signal, sys, time
from gatherlens.commands import params
signal.signal(signal.SIGINT, params.stop_received)
sys.path.insert(0, sys.argv[1])
try:
    import slow_module  # its body gets the signal and sleeps: a stop raised there would cut the import short
    print("imported", slow_module.DONE)
    for _ in range(200):
        time.sleep(0.01)
    print("finished")
except KeyboardInterrupt:
    print("stopped", params.RECEIVED)
"""


def test_a_stop_during_an_import_is_held_until_the_import_is_done(tmp_path):
    """Must hold (issue 40): a stop signal that lands inside an import (a C extension's initialization calling
    back into Python: one CI run's SIGTERM 0.3 s into `generate` aborted the process from torch's C++) is held,
    then delivered once the import is done: the module is whole, the command stops, the signal is recorded once."""
    (tmp_path / "slow_module.py").write_text(
        "import os, signal, time\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(0.3)\nDONE = True\n")
    done = subprocess.run([sys.executable, "-c", _IMPORT_STOP, str(tmp_path)], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.split("\n")[:2] == ["imported True", "stopped ['SIGINT']"], (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
