"""The command line's own faults: an internal error is one line, bad ints and text files are one
`Error:` line, long inputs are shortened, stop signals during `generate` stop it like Ctrl-C."""
from __future__ import annotations

import signal
import subprocess
import sys
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
