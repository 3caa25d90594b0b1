"""`gatherlens gather`: toy gathers from the command line, files by extension, --force."""
import xml.etree.ElementTree as ET

import pytest
from click.testing import CliRunner

from gatherlens.cli import main


def run(*args):
    return CliRunner().invoke(main, ["gather", *args], catch_exceptions=False, terminal_width=200)


def test_terminal_gather():
    res = run("--shape", "4,5", "--dim", "0", "--index", "[[0,2,1,3,0]]")
    assert res.exit_code == 0, res.output
    assert "torch.gather(input, 0, index)" in res.output and "(4, 5)" in res.output
    assert "2:11" in res.output  # out[0, 1] picked row 2: value 2*5 + 1


@pytest.mark.parametrize("ext,head", [(".svg", "<svg"), (".html", "<!DOCTYPE html>"),
                                      (".png", "\x89PNG")])
def test_writes_by_extension(tmp_path, ext, head):
    out = tmp_path / f"pic{ext}"
    res = run("--op", "embedding", "--ids", "3,1,4", "--vocab", "10", "--dim", "6",
              "--labels", "The,cat,sat", "-o", str(out))
    assert res.exit_code == 0, res.output
    data = out.read_bytes()
    assert data.startswith(head.encode("latin-1"))
    if ext == ".svg":
        svg = data.decode()
        ET.fromstring(svg)
        assert "(V, d) = (10, 6)" in svg and "cat" in svg


def test_refuses_to_overwrite_without_force(tmp_path):
    out = tmp_path / "g.svg"
    out.write_text("mine")
    res = CliRunner().invoke(main, ["gather", "--shape", "3,3", "--index", "[[0,1,2]]",
                                    "-o", str(out)])
    assert res.exit_code != 0 and "exists; pass --force" in res.output
    assert out.read_text() == "mine"
    res = run("--shape", "3,3", "--index", "[[0,1,2]]", "-o", str(out), "--force")
    assert res.exit_code == 0 and out.read_text().startswith("<svg")


@pytest.mark.parametrize("args,msg", [
    (["--shape", "4,5", "--index", "[[0,9]]"], "index value 9 at position (0, 1) is outside"),
    (["--shape", "4,5", "--index", "[[0,x]]"], "could not read"),
    (["--shape", "4,5", "--index", "[[0.5]]"], "must hold integers"),
    (["--shape", "4,5", "--index", "[[0],[1,2]]"], "not a rectangular array"),
    (["--shape", "4,5", "--index", "[[[0]]]"], "same number of dimensions"),
    (["--shape", "4,-5", "--index", "0"], "positive sizes"),
    (["--index", "[[0]]"], "exactly one of --shape"),
    (["--shape", "4,5"], "needs --index"),
    (["--op", "embedding", "--vocab", "10"], "needs --ids"),
    (["--op", "embedding", "--ids", "3,11", "--vocab", "10"],
     "token id 11 at position (1,) is outside the vocabulary [0, 10)"),
    (["--op", "index_select", "--shape", "3,3", "--dim", "1", "--index", "[[0]]"], "1-D"),
    (["--shape", "3,3", "--index", "0", "-o", "x.txt"], "must end in .svg or .html or .htm or .png"),
])
def test_bad_input_is_a_clear_error(args, msg):
    res = CliRunner().invoke(main, ["gather", *args])
    assert res.exit_code != 0
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert msg in res.output, res.output
    assert "Traceback" not in res.output


def test_other_ops_and_chinese(tmp_path):
    res = run("--op", "index_select", "--shape", "3,4", "--dim", "1", "--index", "3,0",
              "--lang", "zh")
    assert res.exit_code == 0 and "源张量" in res.output
    res = run("--op", "take_along_dim", "--values", "[[10,30,20]]", "--dim", "1",
              "--index", "[[0,2,1]]")
    assert res.exit_code == 0 and "take_along_dim" in res.output
    out = tmp_path / "m.html"
    res = run("--mistakes", "--lang", "zh", "-o", str(out))
    assert res.exit_code == 0 and "RuntimeError" in out.read_text()
    res = run("--mistakes")
    assert res.exit_code == 0 and "W.gather(0, ids)" in res.output
