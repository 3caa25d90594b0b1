"""Fault injection in what commands write: outputs that cannot be written (checked before any
work), a report folder removed or a disk full while writing, files made between the check and
the write, kill -9 while writing (gatherlens.outputs, the one output rule)."""
from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from fault_helpers import WORKER, error_lines, no_load, on_small_disk, read_only, run, wait_for  # noqa: E402
from fault_helpers import tiny_dir  # noqa: E402,F401,F811 - fixtures, found by name

from gatherlens.errors import GatherValueError  # noqa: E402


@pytest.mark.parametrize("case", ["under-a-file", "read-only"])
def test_explain_out_is_checked_before_the_model_loads(tmp_path, monkeypatch, case):
    """Must hold: --out that cannot be written is one error line before the model loads."""
    (tmp_path / "a-file").write_text("mine")
    out = tmp_path / "a-file" / "report" if case == "under-a-file" else tmp_path / "ro" / "report"
    if case == "read-only":
        (tmp_path / "ro").mkdir()
        read_only(monkeypatch, tmp_path / "ro")
    no_load(monkeypatch)
    result = run("explain", "hi", "--out", str(out))
    assert result.exit_code == 1
    assert ("is a file" if case == "under-a-file" else "Read-only file system") in result.output
    assert (tmp_path / "a-file").read_text() == "mine"


@pytest.mark.parametrize("args", [["gather", "--shape", "4,5", "--index", "[[1,2]]", "-o", "{ro}/g.svg"],
                                  ["gather", "--shape", "4,5", "--index", "[[1,2]]", "-o", "{ro}/g.png"],
                                  ["gather", "--mistakes", "-o", "{ro}/m.png"],
                                  ["eval", "--out", "{ro}/q.json"], ["eval", "--plot", "{ro}/q.png"],
                                  ["bench", "embedding", "--json", "{ro}/b.json"]],
                         ids=["gather-svg", "gather-png", "mistakes-png", "eval-out", "eval-plot", "bench-json"])
def test_unwritable_outputs_fail_in_one_line_before_any_work(tmp_path, monkeypatch, args):
    """Must hold: an output in a read-only folder is one error line naming it; nothing is written."""
    (tmp_path / "ro").mkdir()
    read_only(monkeypatch, tmp_path / "ro")
    no_load(monkeypatch)
    result = run(*[a.format(ro=tmp_path / "ro") for a in args])
    assert result.exit_code != 0 and "Read-only file system" in result.output, result.output
    assert list((tmp_path / "ro").iterdir()) == []


def test_the_folder_holding_a_report_removed_while_writing(tiny_dir, tmp_path, monkeypatch):
    """Must hold: the folder the report goes into removed while the report is written (its files go
    to a temporary folder beside it first): one error line naming the report's own path, no
    temporary folder anywhere, the user's file beside it untouched.
    (Before issue 40 the report's files were written in place; removing the report folder itself
    now simply makes a new one, so the fault is removing the folder that holds it.)"""
    from gatherlens import outputs

    work = tmp_path / "work"
    work.mkdir()
    out = work / "report"
    (tmp_path / "notes.txt").write_text("mine")
    real = outputs.write_new

    def write_new(path, data, shown=None):
        if Path(path).name == "03-heads.svg":
            shutil.rmtree(work)  # another program (or the user) removes the folder mid-write
        return real(path, data, shown)

    monkeypatch.setattr("gatherlens.report.build.write_new", write_new)
    result = run("explain", "The cat sat", "--model", str(tiny_dir), "--out", str(out))
    last = result.output.strip().splitlines()[-1]
    assert result.exit_code == 1 and "No such file or directory" in last, result.output
    assert str(out / "03-heads.svg") in last and "removed meanwhile" in last and len(last) < 400, last
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
    assert (tmp_path / "notes.txt").read_text() == "mine"


class _FullDisk:
    """`open` for gatherlens.outputs: the `n`-th file opened for writing fails its write with ENOSPC
    (a full disk fails the write, which names no file), as a real full disk does."""

    def __init__(self, n: int):
        self.n, self.count = n, 0

    def __call__(self, path, mode="r", *a, **k):
        fh = open(path, mode, *a, **k)
        if "x" in mode or "w" in mode:
            self.count += 1
            if self.count == self.n:
                def write(data):
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                fh.write = write
        return fh


@pytest.mark.parametrize("force", [False, True], ids=["new", "force"])
def test_disk_full_while_writing_a_report_keeps_the_earlier_report(tiny_dir, tmp_path, monkeypatch, force):
    """Must hold: ENOSPC while writing the report is one error line naming the file that did not
    fit (its path in the report folder, not a temporary one); without --force no report folder is
    left; with --force the earlier report is as it was, byte for byte, and the user's own file in
    the folder too; no temporary folder or file is left anywhere.
    (Before issue 40 the earlier report was deleted first: a full disk left half of each.)"""
    from gatherlens import outputs

    out = tmp_path / "report"
    if force:
        assert run("explain", "The dog ran", "--model", str(tiny_dir), "--out", str(out)).exit_code == 0
        (out / "notes.txt").write_text("mine")
    before = {p.name: p.read_bytes() for p in out.iterdir()} if force else {}
    monkeypatch.setattr(outputs, "open", _FullDisk(3), raising=False)
    result = run("explain", "The cat sat", "--model", str(tiny_dir), "--out", str(out), *(["--force"] * force))
    last = result.output.strip().splitlines()[-1]
    assert result.exit_code == 1 and last.startswith("Error: No space left on device: "), result.output
    assert f"{str(out)}/0" in last and ".gatherlens-tmp" not in last, last
    assert sorted(p.name for p in tmp_path.iterdir()) == (["report"] if force else [])
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before if force else not out.exists()


STOPPED_EXPLAIN = """
import os, sys, time, pathlib
import gatherlens.outputs as outputs
import gatherlens.report.build as build
ready, real = pathlib.Path(sys.argv[1]), outputs.write_new
def slow(path, data, shown=None):            # the real writer, slowed so that a signal lands mid-write
    real(path, data, shown)
    ready.touch()
    time.sleep(0.5)
build.write_new = slow
from gatherlens.cli import main
main(sys.argv[2:], prog_name="gatherlens")
"""


@pytest.mark.slow
@pytest.mark.parametrize("force", [False, True], ids=["new", "force"])
@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM", "SIGKILL"])
def test_explain_stopped_while_writing_leaves_the_earlier_report_whole(tiny_dir, tmp_path, monkeypatch, signame,
                                                                      force):
    """Must hold: Ctrl-C (SIGINT), kill (SIGTERM) or kill -9 while `explain` writes its report leaves
    no half report: without --force no report folder, with --force the earlier report byte for byte.
    SIGINT / SIGTERM: one `Error: stopped (...)` line, exit 1, nothing else left. kill -9: only a hidden
    temporary folder beside the report, which the next run's check removes; that run is not refused
    as "not empty". (Before issue 40: a half-written report, and with --force the earlier one gone.)"""
    import gatherlens.models
    from gatherlens import outputs

    out, ready = tmp_path / "report", tmp_path / "ready"
    if force:
        assert run("explain", "The dog ran", "--model", str(tiny_dir), "--out", str(out)).exit_code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()} if force else {}
    child = subprocess.Popen([sys.executable, "-c", STOPPED_EXPLAIN, str(ready), "explain", "The cat sat",
                              "--model", str(tiny_dir), "--out", str(out), *(["--force"] * force)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(ready, "the report's first file", timeout=300)
        child.send_signal(getattr(signal, signame))
        _, err = child.communicate(timeout=120)
    finally:
        child.kill()
    assert ({p.name: p.read_bytes() for p in out.iterdir()} == before) if force else not out.exists()
    left = sorted(p.name for p in tmp_path.iterdir() if p.name not in ("report", "ready"))
    if signame != "SIGKILL":
        assert child.returncode == 1 and "Traceback" not in err, err
        assert error_lines(type("R", (), {"output": err})) == [
            f"Error: stopped ({'Ctrl-C' if signame == 'SIGINT' else signame}) before the report was complete: "
            f"nothing was written to {str(out)!r} (an earlier report there is as it was)"], err
        assert left == [], left
        return
    assert len(left) == 1 and left[0].startswith(f".gatherlens-tmp-{child.pid}-"), left

    def stop(*a, **k):
        raise GatherValueError("stop")

    monkeypatch.setattr(gatherlens.models, "load", stop)
    monkeypatch.setattr(outputs, "_CLEANED", set())
    result = run("explain", "The cat sat", "--model", str(tiny_dir), "--out", str(out), *(["--force"] * force))
    assert error_lines(result) == ["Error: stop"], result.output           # not "not empty", not blocked
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "ready") == (["report"] if force else [])


FULL_DISK_EXPLAIN = """
import json, os, pathlib, shutil, subprocess, sys
disk = pathlib.Path(os.environ["SMALL_DISK"])
out, tiny, force = disk / "report", sys.argv[1], sys.argv[2] == "1"
shutil.copytree(sys.argv[3], out) if force else None          # the earlier report, on the small disk
(out / "notes.txt").write_text("mine") if force else None
before = {p.name: p.read_bytes().hex() for p in out.iterdir()} if force else {}
run = subprocess.run([sys.executable, "-m", "gatherlens", "explain", "The cat sat", "--model", tiny, "--out",
                      str(out)] + ["--force"] * force, capture_output=True, text=True)
after = {p.name: p.read_bytes().hex() for p in out.iterdir()} if out.exists() else None
print(json.dumps({"rc": run.returncode, "err": run.stderr, "same": after == (before if force else None),
                  "left": sorted(p.name for p in disk.iterdir())}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("force", [False, True], ids=["new", "force"])
def test_a_real_full_disk_while_writing_a_report(tiny_dir, tmp_path, force):
    """Must hold, on a real full disk (a tmpfs 1.5x the earlier report's pages: no room for a second): one `Error: No space left on device: '<report>/<file>'` line, exit 1; the
    earlier report and the user's file byte for byte (--force) or no report folder; nothing else."""
    earlier = tmp_path / "earlier"
    assert run("explain", "The dog ran", "--model", str(tiny_dir), "--out", str(earlier)).exit_code == 0
    held = sum(-(-p.stat().st_size // 4096) * 4 for p in earlier.iterdir())  # KiB in tmpfs pages
    size = held * 3 // 2 + 16 if force else 200  # room for the earlier report, not for a second beside it
    seen = on_small_disk(FULL_DISK_EXPLAIN, size, tmp_path / "disk", str(tiny_dir), str(int(force)), str(earlier))
    lines = [line for line in seen["err"].splitlines() if line.startswith("Error:")]
    assert seen["rc"] == 1 and len(lines) == 1 and "Traceback" not in seen["err"], seen["err"]
    assert lines[0].startswith("Error: No space left on device: ") and "/report/" in lines[0], lines
    assert seen["same"] and seen["left"] == (["report"] if force else []), seen


# -- outputs written late: checked at the start, checked again as they are written --------------
def test_a_file_made_after_the_check_is_refused_and_kept(tmp_path):
    """Must hold: without --force the late write creates the file exclusively: a file that
    appeared since the check at the start is refused by name and left as it was."""
    from gatherlens.outputs import output_file, write_output

    path = output_file(tmp_path / "pages.svg", "--pages", suffixes=(".svg",))
    path.write_text("another program's file")                      # created meanwhile
    with pytest.raises(GatherValueError, match=r"--pages .*pages.svg' was created meanwhile.*--force"):
        write_output(path, "<svg/>", "--pages")
    assert path.read_text() == "another program's file"
    assert write_output(path, "<svg/>", "--pages", force=True) == path and path.read_text() == "<svg/>"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pages.svg"]   # no temporary file left


@pytest.mark.parametrize("force", [False, True], ids=["new", "force"])
def test_a_failure_while_writing_leaves_no_half_file(tmp_path, force):
    """Must hold: a write that fails midway leaves no half-written output and no temporary
    file; with --force the file it was replacing is still whole."""
    from gatherlens.outputs import open_output

    path = tmp_path / "results.json"
    if force:
        path.write_text("the earlier results")
    with pytest.raises(OSError, match="No space left"):
        with open_output(path, "--json", force=force) as fh:
            fh.write("{\"half\": ")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    assert sorted(p.name for p in tmp_path.iterdir()) == (["results.json"] if force else [])
    assert not force or path.read_text() == "the earlier results"


def test_the_output_rule_names_what_is_wrong(tmp_path):
    """Must hold: each refusal is one GatherValueError naming the option, the path and the way out."""
    from gatherlens.outputs import output_dir, output_file, write_output

    (tmp_path / "dir.svg").mkdir()
    (tmp_path / "notes.txt").write_text("mine")
    cases = [(lambda: output_file(tmp_path / "dir.svg", "--pages", force=True), "is a folder; give a file path"),
             (lambda: output_file(tmp_path / "p.png", "--pages", suffixes=(".svg", ".html")),
              "must end in .svg or .html"),
             (lambda: output_file(tmp_path / "notes.txt", "--out"), "exists; pass --force"),
             (lambda: output_file(tmp_path / "notes.txt" / "p.svg", "--out"), "is a file, not a folder"),
             (lambda: output_file(tmp_path / "no" / "p.svg", "--out"), "does not exist"),
             (lambda: output_dir(tmp_path, "--out"), "is not empty; pass --force"),
             (lambda: output_dir(tmp_path / "notes.txt" / "pics", "--out"), "is a file"),
             (lambda: write_output(tmp_path / "gone" / "p.svg", "x", "--pages"), "does not exist")]
    for call, message in cases:
        with pytest.raises(GatherValueError, match=message):
            call()
    assert output_dir(tmp_path, "--out", force=True) == tmp_path and output_dir(tmp_path / "new", "--out")
    assert (tmp_path / "notes.txt").read_text() == "mine" and not (tmp_path / "new").exists()


# -- late writes of the commands: a file made between the check at the start and the write ----------
def _made_meanwhile(monkeypatch, module, name: str, path: Path, content: bytes) -> None:
    """Wrap `module.name` (the work a command does between its start check and its write) so that
    another program creates `path` while it runs; the work itself is the real one."""
    real = getattr(module, name)

    def work(*args, **kwargs):
        result = real(*args, **kwargs)
        path.write_bytes(content)                                   # another program's file, meanwhile
        return result

    monkeypatch.setattr(module, name, work)


@pytest.mark.parametrize("suffix,head", [(".svg", b"<svg"), (".png", b"\x89PNG")])
def test_gather_picture_made_meanwhile_is_kept_without_force(tmp_path, monkeypatch, suffix, head):
    """Must hold: `gatherlens gather -o FILE` refuses, by name, a FILE that appeared while it drew
    and leaves it as it was; with --force it replaces it with the picture; no temporary file left."""
    import gatherlens.commands.gather as gather_command

    out = tmp_path / f"g{suffix}"
    _made_meanwhile(monkeypatch, gather_command, "_build", out, b"another program's file")
    args = ("gather", "--shape", "3,3", "--index", "[[0,1,2]]", "-o", str(out))
    result = run(*args)
    assert result.exit_code == 1 and "was created meanwhile" in result.output and "--force" in result.output
    assert out.read_bytes() == b"another program's file"
    out.unlink()
    result = run(*args, "--force")
    assert result.exit_code == 0, result.output
    assert out.read_bytes().startswith(head) and sorted(p.name for p in tmp_path.iterdir()) == [out.name]


def test_bench_page_made_meanwhile_is_kept_without_force(tmp_path, monkeypatch):
    """Must hold: `gatherlens bench page -o FILE` checks FILE first and creates it exclusively: a
    FILE made while it read the results is refused and kept; with --force it is replaced."""
    import gatherlens.bench.page as bench_page
    from gatherlens.bench.output import write_results

    results, out = tmp_path / "decode.json", tmp_path / "benchmarks.md"
    write_results(results, "decode", {"threads": 2}, [{"context": 8192, "speedup": 2.5}], force=False)
    _made_meanwhile(monkeypatch, bench_page, "page", out, b"my notes")
    result = run("bench", "page", str(results), "-o", str(out))
    assert result.exit_code == 1 and "benchmarks.md' was created meanwhile" in result.output, result.output
    assert out.read_bytes() == b"my notes"
    out.unlink()
    result = run("bench", "page", str(results), "-o", str(out), "--force")
    assert result.exit_code == 0 and "| 8192 | 2.5 |" in out.read_text(), result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["benchmarks.md", "decode.json"]


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_eval_table_made_meanwhile_is_kept_without_force(tmp_path, suffix):
    """Must hold: eval's one CSV/JSON writer, given the command's --force (False), refuses a file
    made since the check at the start and keeps it; with force=True it replaces it whole."""
    from gatherlens.eval.io import write_table
    from gatherlens.outputs import output_file

    what = f"--{suffix[1:]}"
    path = output_file(tmp_path / f"q{suffix}", what, suffixes=(suffix,))   # the check at the start
    path.write_text("another program's file")                              # created meanwhile
    rows = [{"setting": "dense", "perplexity": 17.9}, {"setting": "budget=512", "perplexity": 18.3}]
    with pytest.raises(GatherValueError, match=rf"{what} .*q\{suffix}' was created meanwhile.*--force"):
        write_table(path, rows, ("setting", "perplexity"), {"model": "tiny"}, force=False, what=what)
    assert path.read_text() == "another program's file"
    write_table(path, rows, ("setting", "perplexity"), {"model": "tiny"}, force=True, what=what)
    text = path.read_bytes().decode("utf-8")
    if suffix == ".json":
        assert json.loads(text) == {"meta": {"model": "tiny"}, "rows": rows}
    else:
        assert text == "setting,perplexity\r\ndense,17.9\r\nbudget=512,18.3\r\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


KILLED_WRITER = """
import sys, time
from gatherlens.outputs import open_output
path, force, ready = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
with open_output(path, "--plot", force=force, binary=True) as fh:   # eval --plot's writer (eval/plot.py)
    fh.write(b"\\x89PNG half a plot")
    fh.flush()
    open(ready, "w").close()
    time.sleep(120)
"""


def _killed_while_writing(path: Path, force: bool) -> int:
    """A real process writing `path` by the output rule, killed with SIGKILL mid-write; its pid."""
    ready = path.with_name("ready")
    child = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(path), "1" if force else "0", str(ready)])
    wait_for(ready, "the writer to start writing", timeout=60)
    ready.unlink()
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=30)
    return child.pid


@pytest.mark.parametrize("force", [False, True], ids=["new", "force"])
def test_kill_9_while_writing_a_plot_blocks_nothing_and_leaves_nothing(tmp_path, monkeypatch, force):
    """Must hold: a run killed (kill -9) while writing --plot leaves no target (with --force the
    earlier file whole), only a hidden `.gatherlens-tmp-PID-…` file, which the rerun's output
    check removes (its process is gone); the rerun is not blocked. A live writer's file is kept."""
    import gatherlens.models
    from gatherlens import outputs

    path = tmp_path / "q.png"
    if force:
        path.write_bytes(b"the earlier plot")
    pid = _killed_while_writing(path, force)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([*(["q.png"] if force else []), *[n for n in left if n.startswith(f".gatherlens-tmp-{pid}-")]])
    assert len(left) == (2 if force else 1), left
    assert not force or path.read_bytes() == b"the earlier plot"

    def stop(*a, **k):
        raise GatherValueError("stop")

    monkeypatch.setattr(gatherlens.models, "load", stop)
    monkeypatch.setattr(outputs, "_CLEANED", set())
    result = run("eval", "--text", str(WORKER), "--plot", str(path), *(["--force"] if force else []))
    assert error_lines(result) == ["Error: stop"], result.output           # not "exists", not blocked
    assert sorted(p.name for p in tmp_path.iterdir()) == (["q.png"] if force else [])
    assert outputs.write_output(path, b"\x89PNG whole", "--plot", force=force) == path
    assert path.read_bytes() == b"\x89PNG whole" and sorted(p.name for p in tmp_path.iterdir()) == ["q.png"]


def test_a_live_writers_temporary_file_is_kept(tmp_path):
    """Must hold: the stale-file sweep removes only files of processes that are gone."""
    from gatherlens.outputs import clean_stale_temps

    ready = tmp_path / "ready"
    child = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(tmp_path / "q.png"), "0", str(ready)])
    try:
        wait_for(ready, "the writer to start writing", timeout=60)
        (tmp_path / "notes.42-deadbeef.txt").write_text("mine")
        assert clean_stale_temps(tmp_path) == []
        assert any(p.name.startswith(f".gatherlens-tmp-{child.pid}-") for p in tmp_path.iterdir())
    finally:
        child.kill()
        child.wait(timeout=30)
