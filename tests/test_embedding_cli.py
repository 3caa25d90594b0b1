"""`gatherlens lookup` and `gatherlens bench embedding` through click's test runner."""
import json

from click.testing import CliRunner

from gatherlens.bench.embedding import command as bench_command
from gatherlens.cli import main


def test_lookup_draws_the_picked_rows():
    result = CliRunner().invoke(main, ["lookup", "--ids", "3,1,4", "--vocab", "6", "--dim", "3"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "W[ids]" in out and "(V, d) = (6, 3)" in out and "(S, d) = (3, 3)" in out
    rows = [line.split() for line in out.splitlines()]
    picked = [r for r in rows if len(r) >= 2 and r[-3:-2] and ":" in r[-1]]   # output rows "i  id:value ..."
    assert [r[-1].split(":")[0] for r in picked] == ["3", "1", "4"]


def test_lookup_bad_id_is_a_clear_error():
    result = CliRunner().invoke(main, ["lookup", "--ids", "3,11", "--vocab", "10"])
    assert result.exit_code == 2
    assert "token id 11 at position (1,) is outside the vocabulary [0, 10)" in result.output


def test_lookup_non_integer_ids():
    result = CliRunner().invoke(main, ["lookup", "--ids", "3,x"])
    assert result.exit_code == 2 and "comma-separated integers" in result.output


def test_bench_tiny_grid_writes_json(tmp_path):
    path = tmp_path / "bench.json"
    args = ["--vocab", "100", "--dim", "8", "--tokens", "1,64", "--dtype", "float32,bfloat16",
            "--threads", "1", "--repeats", "1", "--json", str(path)]
    result = CliRunner().invoke(main, ["bench", "embedding", *args])
    assert result.exit_code == 0, result.output
    rows = json.loads(path.read_text())["rows"]
    ops = {(r["direction"], r["op"]) for r in rows}
    for op in ("fast", "F.embedding", "index_select", "gather", "indexing", "one_hot", "naive",
               "copy_fresh", "copy_into", "fast out="):
        assert ("forward", op) in ops
    assert ("backward", "fast") in ops and ("backward", "F.embedding") in ops
    assert len({(r["tokens"], r["dtype"]) for r in rows}) == 4
    assert all(r["median_s"] > 0 for r in rows)
    # refuses to overwrite without --force
    again = CliRunner().invoke(bench_command, args)
    assert again.exit_code == 2 and "--force" in again.output
    assert CliRunner().invoke(bench_command, [*args, "--force", "--no-backward"]).exit_code == 0


def test_bench_rejects_unknown_dtype(tmp_path):
    result = CliRunner().invoke(bench_command, ["--dtype", "float8", "--json", str(tmp_path / "x.json")])
    assert result.exit_code == 2 and "float8" in result.output
