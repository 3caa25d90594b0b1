"""`gatherlens eval-long`: the RULER-style tasks made from real prose, their scores, the intervals and the command."""
from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from gatherlens.errors import GatherValueError
from gatherlens.eval.corpus import load_text
from gatherlens.eval.long_context import ROWS, long_report, row_setup
from gatherlens.eval.long_tasks import GROUPS, TASKS, Haystack, Question, make_sample, score
from gatherlens.eval.stats import bootstrap_interval, wilson_interval


class WordTokenizer:
    """One id per whitespace-separated word (enough to count tokens the way a tokenizer would)."""

    def __init__(self):
        self.ids = {}

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [self.ids.setdefault(w, len(self.ids)) for w in text.split()]}


@pytest.fixture(scope="module")
def hay():
    return Haystack(WordTokenizer(), load_text("pydoc"))


@pytest.mark.parametrize("length", [600, 2048])
def test_a_sample_holds_every_needle_once_at_its_length(hay, length):
    for group in GROUPS:
        sample = make_sample(hay, length, seed=1, tasks=group)
        text = " ".join(w for w, i in sorted(hay.tokenizer.ids.items(), key=lambda kv: kv[1])
                        if i in set(sample.prompt_ids[0].tolist()))  # the words it holds
        assert [q.task for q in sample.questions] == list(group)
        assert length - 200 <= sample.prompt_ids.shape[1] <= length  # room left for the question and the answer
        for q in sample.questions:
            for w in q.wanted:
                assert w.strip(".") in text or q.task == "cwe", (q.task, w)
            assert all(0 <= d <= 1 for d in sample.depths[q.task])
        again = make_sample(hay, length, seed=1, tasks=group)
        assert again.prompt_ids.tolist() == sample.prompt_ids.tolist()  # seeded: the same sample every run
        assert make_sample(hay, length, seed=2, tasks=group).prompt_ids.tolist() != sample.prompt_ids.tolist()


def test_the_chain_and_the_needles_are_in_order_in_the_text(hay):
    sample = make_sample(hay, 4096, seed=3, tasks=("vt", "niah_multivalue"))
    words = {i: w for w, i in hay.tokenizer.ids.items()}
    text = " ".join(words[i] for i in sample.prompt_ids[0].tolist())
    vt = next(q for q in sample.questions if q.task == "vt")
    first = text.index(f"VAR {vt.wanted[0]} =")
    assert all(text.index(f"VAR {b} = VAR {a}.") > first for a, b in zip(vt.wanted, vt.wanted[1:]))
    assert len(re.findall(r"special magic values for", text)) == 4


def test_scores_are_the_share_of_wanted_strings_found():
    q = Question("niah_multiquery", "", ("1234567", "7654321"), 8)
    assert score(q, " 1234567 and 7654321.") == 1.0 and score(q, " 1234567, 12345678") == 0.5
    assert score(Question("cwe", "", ("tiger", "iris"), 8), "TIGER, irises") == 0.5  # whole words, any case


def test_wilson_and_bootstrap_intervals():
    lo, hi = wilson_interval(0, 10)
    assert lo == 0.0 and 0.25 < hi < 0.35
    lo, hi = bootstrap_interval([0.0, 0.5, 1.0, 1.0], seed=3)
    assert 0.0 <= lo < 0.625 < hi <= 1.0 and bootstrap_interval([0.0, 0.5, 1.0, 1.0], seed=3) == (lo, hi)
    with pytest.raises(GatherValueError, match="successes = 3 of n = 2"):
        wilson_interval(3, 2)


def test_the_report_judges_every_row_against_dense_on_the_same_samples():
    records = [{"row": row, "length": 2048, "seed": s, "task": "niah_single", "score": float(ok)}
               for s in range(10) for row, ok in (("dense", s < 8), ("auto", s < 8), ("256", s < 2))]
    report = long_report(records)
    dense, auto, small = report.rows
    assert dense["setting"] == "dense" and dense["accuracy"] == 0.8 and "equal" not in dense
    assert auto["equal"] and auto["diff"] == 0.0 and auto["ci"] == dense["ci"]
    assert not small["equal"] and small["diff"] == pytest.approx(-0.6)
    with pytest.raises(GatherValueError, match="no answers"):
        long_report([])


def test_rows_name_their_setup():
    assert row_setup("dense") == (None, None, False) and row_setup("int8 pages") == (None, "int8", False)
    assert row_setup("auto") == ({"budget": "auto"}, "float16", False) and row_setup("sparse prefill")[2]
    assert row_setup("384") == ({"budget": 384}, "float16", False)
    with pytest.raises(GatherValueError, match="row 'fast'"):
        row_setup("fast")
    assert ROWS[0] == "dense" and set(TASKS) == {t for g in GROUPS for t in g}


def test_eval_long_from_records_writes_the_table_and_the_plot(tmp_path):
    from gatherlens.cli import main

    src = tmp_path / "answers.jsonl"
    src.write_text("".join(json.dumps({"row": row, "length": n, "seed": s, "task": t, "score": float((s + n) % 3 > 0)})
                           + "\n" for row in ("dense", "auto") for n in (2048, 4096) for s in range(4)
                           for t in ("niah_single", "vt")))
    out = {k: tmp_path / f"long.{k}" for k in ("json", "csv", "png")}
    res = CliRunner().invoke(main, ["eval-long", "--from", str(src), "--json", str(out["json"]), "--csv",
                                    str(out["csv"]), "--plot", str(out["png"])])
    assert res.exit_code == 0, res.output
    data = json.loads(out["json"].read_text())
    assert len(data["rows"]) == 8 and all(r["equal"] for r in data["rows"] if r["setting"] == "auto")
    assert out["csv"].read_text().startswith("setting,length,task") and out["png"].read_bytes()[:4] == b"\x89PNG"
    assert "accuracy [95%]" in res.output and " =" in res.output
    bad = CliRunner().invoke(main, ["eval-long", "--from", str(src), "--rows", "dense,fast"])
    assert bad.exit_code == 2 and "--rows" in bad.output


@pytest.mark.slow
def test_eval_long_runs_a_model_and_appends_its_answers(tmp_path):
    from tiny_models import make_tiny_llama

    from gatherlens.cli import main

    model = make_tiny_llama(tmp_path / "tiny")
    records = tmp_path / "answers.jsonl"
    args = ["eval-long", "--model", str(model), "--corpus", "pydoc", "--lengths", "700", "--samples", "1",
            "--rows", "dense,auto,256,sparse prefill,int8 pages", "--tasks", "niah_single,niah_multikey",
            "--records", str(records)]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    lines = [json.loads(line) for line in records.read_text().splitlines()]
    assert len(lines) == 5 * 2 and {r["row"] for r in lines} == {"dense", "auto", "256", "sparse prefill", "int8 pages"}
    assert all(0.0 <= r["score"] <= 1.0 and isinstance(r["answer"], str) for r in lines)
