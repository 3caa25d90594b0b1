"""The demo from one command: `gatherlens dist demo --nproc 2` (torchrun underneath), checked end to end."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from gatherlens.cli import main as cli_main


@pytest.mark.slow  # a subprocess (torchrun and its ranks)
def test_demo_from_one_command(tmp_path):
    out = tmp_path / "pics"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-m", "gatherlens", "dist", "demo", "--nproc", "2", "--vocab", "1000",
         "--context", "300", "--budget", "64", "--out", str(out)],
        capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = proc.stdout
    assert "gatherlens.dist demo on 2 ranks (gloo)" in text
    assert "rank 0: embedding rows [0, 500) of 1000" in text and "rank 1: embedding rows [500, 1000)" in text
    assert "rank 0: KV tokens [0, 160)" in text and "rank 1: KV tokens [160, 300)" in text
    assert text.count("same pages as one process: True") == 2
    assert text.rstrip().endswith("every rank equals one process")
    assert sorted(p.name for p in out.iterdir()) == [
        "sharded_pages.svg", "vocab_shard_rank0.svg", "vocab_shard_rank1.svg", "vocab_sum.svg"]


def test_demo_keeps_a_non_empty_folder(tmp_path):
    (tmp_path / "mine.svg").write_text("keep me")
    result = CliRunner().invoke(cli_main, ["dist", "demo", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "not empty; pass --force" in result.output
    assert (tmp_path / "mine.svg").read_text() == "keep me"


def test_module_without_torchrun_says_how_to_start(monkeypatch, capsys):
    from gatherlens.dist.__main__ import main

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert main(["demo"]) == 2
    assert "torchrun --nproc-per-node 2 -m gatherlens.dist demo" in capsys.readouterr().err


def test_an_out_that_is_a_file_is_refused_before_any_rank_starts(tmp_path, monkeypatch, capsys):
    from gatherlens.dist.__main__ import main

    afile = tmp_path / "notes.txt"
    afile.write_text("keep me")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["demo", "--out", str(afile)]) == 2                 # torchrun -m gatherlens.dist demo
    assert "notes.txt" in capsys.readouterr().err and afile.read_text() == "keep me"
    result = CliRunner().invoke(cli_main, ["dist", "demo", "--out", str(afile / "pics")])
    assert result.exit_code != 0 and "is a file" in result.output   # gatherlens dist demo


def test_both_entry_points_read_the_options_from_demo_config():
    """The demo's options are defined once (DemoConfig's fields): click's and argparse's are the
    same names, defaults and ranges, and the command line torchrun gets parses back to the config."""
    from pathlib import Path

    import pytest

    from gatherlens.commands.dist import demo
    from gatherlens.dist.__main__ import build_parser
    from gatherlens.dist.demo_config import DemoConfig, demo_options

    defaults = {o.name: o.default for o in demo_options()}
    assert {p.name: p.default for p in demo.params if p.name != "nproc"} == defaults
    parsed = vars(build_parser().parse_args(["demo"]))
    assert parsed.pop("command") == "demo" and parsed == defaults
    assert set(defaults) == {"vocab", "context", "budget", "page_size", "out", "device", "force"}
    cfg = DemoConfig(vocab=1000, context=300, budget=64, page_size=8, out=Path("pics"), device="cpu", force=True)
    assert DemoConfig.from_options(vars(build_parser().parse_args(["demo", *cfg.argv()]))) == cfg
    with pytest.raises(SystemExit):
        build_parser().parse_args(["demo", "--page-size", "0"])
    result = CliRunner().invoke(cli_main, ["dist", "demo", "--page-size", "0"])
    assert result.exit_code == 2 and "--page-size" in result.output
