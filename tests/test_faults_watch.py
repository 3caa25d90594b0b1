"""A model file changed under a running model (models/files/watch.py, ops/fault/sigbus.cpp): the
file watch, the SIGBUS guard, a GGUF truncated or overwritten under `generate --quantized`."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from fault_helpers import needs_compiler  # noqa: E402

from gatherlens.errors import GatherValueError  # noqa: E402


# -- a model file changed under a running model (models/files/watch.py, ops/fault/sigbus.cpp) ----
def test_a_model_file_watch_says_how_the_file_changed(tmp_path):
    """Must hold: FileWatch notices a rewrite of the same size, a size change, a file put in its
    place and a removal, each said in words; check() raises the one ModelFileChanged message."""
    from gatherlens.models.files.watch import FileWatch, ModelFileChanged

    path = tmp_path / "m.gguf"
    path.write_bytes(b"x" * 100)
    watch = FileWatch(path)
    assert watch.changed() is None
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert watch.changed() == "it was rewritten"
    watch = FileWatch(path)
    os.truncate(path, 10)
    assert watch.changed() == "its size went from 100 to 10 bytes"
    with pytest.raises(ModelFileChanged, match=r"^the model file '.*m\.gguf' changed while in use \(its size"):
        watch.check()
    watch = FileWatch(path)
    (tmp_path / "new").write_bytes(b"y" * 10)
    os.replace(tmp_path / "new", path)
    assert watch.changed() == "another file was put in its place"
    path.unlink()
    assert watch.changed() == "it was removed or cannot be read"


SIGBUS_MAPPING = """
import os, sys
import numpy as np
from gatherlens.ops.fault import guard_mapping, kernel_loaded
path, other = sys.argv[1], sys.argv[2]
for p in (path, other):
    with open(p, "wb") as f:
        f.write(b"x" * (1 << 20))
m, o = np.memmap(path, mode="c"), np.memmap(other, mode="c")
assert kernel_loaded()
guard_mapping(m.__array_interface__["data"][0], m.nbytes, "Error: the mapped file changed while in use\\n")
os.truncate(path, 0)
os.truncate(other, 0)
print("reading", flush=True)
print(int((o if sys.argv[3] == "other" else m)[-1]))
"""


@needs_compiler
@pytest.mark.parametrize("which", ["guarded", "other"])
def test_a_sigbus_in_a_guarded_mapping_is_one_line_and_exit_1(tmp_path, which):
    """Must hold: reading a guarded mapping whose file was cut short writes the guard's one line and
    exits 1 (not SIGBUS, 135); a fault in another mapping still dies by SIGBUS as before."""
    out = subprocess.run([sys.executable, "-c", SIGBUS_MAPPING, str(tmp_path / "a"), str(tmp_path / "b"), which],
                         capture_output=True, text=True, timeout=300)
    assert "reading" in out.stdout, out.stderr
    if which == "guarded":
        assert out.returncode == 1 and out.stderr.strip() == "Error: the mapped file changed while in use", out
    else:
        assert out.returncode == -signal.SIGBUS, out


def _smollm2_copy(tmp_path: Path) -> Path:
    from gatherlens.models import resolve

    try:
        source = resolve("smollm2").path
    except GatherValueError as e:   # the model package is not installed
        pytest.skip(str(e))
    copy = tmp_path / "copy.gguf"
    shutil.copyfile(source, copy)
    return copy


def _change(path: Path, how: str) -> None:
    if how == "truncate":
        os.truncate(path, 4096)
    else:                               # overwrite the second half in place, same size
        size = path.stat().st_size
        with open(path, "r+b") as f:
            f.seek(size // 2)
            f.write(os.urandom(size - size // 2))


def _one_changed_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "changed while in use" in lines[0] and "copy.gguf" in lines[0], err
    return lines[0]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["truncate", "overwrite"])
def test_a_gguf_changed_under_generate_quantized_is_one_error_line(tmp_path, how):
    """Must hold: the GGUF truncated or overwritten in place while `generate --quantized` runs from
    it ends the run with exit 1 and one `Error: the model file ... changed while in use` line, no
    traceback (before: SIGBUS, status 135, no message; or silent garbage)."""
    copy = _smollm2_copy(tmp_path)
    child = subprocess.Popen([sys.executable, "-m", "gatherlens", "generate", "Once upon a time", "--quantized",
                              "--model", str(copy), "--max-new-tokens", "64"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert child.stdout.read(1), "no token was generated"     # the first token is out: mid-run
        _change(copy, how)
        out, err = child.communicate(timeout=300)
    finally:
        child.kill()
    assert child.returncode == 1, err.decode()
    _one_changed_line(err.decode())


CUT_MID_STEP = """
import os, sys
import gatherlens.commands.generate as g
import gatherlens.models.runtime.generation as generation
path, real = sys.argv[1], g._write
generation.check_unchanged = lambda model: None      # no check between steps: the next read faults
def cut(piece, result):
    real(piece, result)
    if len(result.new_ids) == 2:
        os.truncate(path, 4096)
g._write = cut
from gatherlens.cli import main
main(sys.argv[2:], prog_name="gatherlens")
"""


@needs_compiler
@pytest.mark.slow
def test_a_gguf_cut_short_inside_a_forward_pass_is_the_same_line(tmp_path):
    """Must hold: a truncation no check between steps sees in time (here: the checks switched off)
    faults inside the model's kernels; the SIGBUS guard says the same one line and exits 1. The file is a
    tiny Llama in F16, whose products read its blocks in place (SmolLM2's Q4_1 and Q8_0 blocks all live in
    panels once loaded, its embedding's rows too, so cutting that file short no longer faults a step)."""
    from tiny_gguf import tiny_model, write_gguf

    copy = write_gguf(tiny_model("llama"), "llama", "F16", tmp_path / "copy.gguf")
    out = subprocess.run([sys.executable, "-c", CUT_MID_STEP, str(copy), "generate", "Once upon a time",
                          "--quantized", "--model", str(copy), "--max-new-tokens", "8"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stderr
    assert "cut short while the model read it" in _one_changed_line(out.stderr)
