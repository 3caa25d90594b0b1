"""The passkey test: a 5-digit number hidden in long filler text, retrieved by greedy generation.

    >>> prompt = passkey_prompt(lm.tokenizer, context=8192, depth=0.5, key="71432")
    >>> results = passkey_trials(lm.model, lm.tokenizer, context=8192, trials=5, budgets=(256, 1024))
    >>> [(r.setting, r.depth, r.answer, r.ok) for r in results]

The prompt (the Landmark-attention / LongLoRA recipe): an instruction, the repeated filler
"The grass is green. The sky is blue. ...", the needle "The pass key is 71432. Remember it.
71432 is the pass key." at a relative depth, and the question "What is the pass key? The pass
key is". The prompt minus its last token is prefilled densely once per trial; every setting
(dense and each budget) then decodes from a copy of that cache: the last prompt token and a few
generated ones, all by decode steps, so sparse selection decides what the answer can see.
"""
from __future__ import annotations

import itertools
import random
import re
from dataclasses import asdict, dataclass

import torch

from gatherlens.errors import GatherValueError
from gatherlens.eval.sparse_quality import SparseQualityReport, SparseSetup, prefill, repage, setups_for_budgets
from gatherlens.models.runtime.generation import greedy_tokens
from gatherlens.models.runtime.decoding import use_dense_decoding, use_sparse_decoding
from gatherlens.ops.sparse.config import QUEST

__all__ = ["PasskeyResult", "passkey_prompt", "passkey_trials", "greedy_decode", "table_rows", "TABLE_COLUMNS"]

INTRO = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
         "I will quiz you about the important information there.\n\n")
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key. "
QUESTION = "\n\nWhat is the pass key? The pass key is"
# the sparse table: quality columns, then passkey trials retrieved and run per setting
TABLE_COLUMNS = (*SparseQualityReport.columns, "passkey_ok", "passkey_trials")


@dataclass
class PasskeyResult:
    setting: str          # "dense" or "budget=1024"
    budget: int | None
    trial: int
    depth: float          # where the needle sits, 0 = start, 1 = end
    context: int          # prompt tokens
    key: str
    answer: str           # the generated text
    ok: bool              # the key appears in the answer

    def as_dict(self) -> dict:
        return asdict(self)


def passkey_prompt(tokenizer, context: int, depth: float, key: str) -> torch.Tensor:
    """Token ids (1, ~context) of the passkey prompt with the needle at relative `depth` in [0, 1]."""
    if not 0.0 <= depth <= 1.0:
        raise GatherValueError(f"depth = {depth} must be in [0, 1] (0 = start of the filler, 1 = end)")
    enc = lambda s: tokenizer(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    head, needle, tail, filler = enc(INTRO), enc(NEEDLE.format(key=key)), enc(QUESTION), enc(FILLER)
    room = context - len(head) - len(needle) - len(tail)
    if room < len(filler):
        raise GatherValueError(
            f"context = {context} tokens is too short for the passkey prompt (needs >= "
            f"{len(head) + len(needle) + len(tail) + len(filler)})")
    reps = room // len(filler)
    before = round(depth * reps)
    ids = head + filler * before + needle + filler * (reps - before) + tail
    return torch.tensor([ids], dtype=torch.long)  # (1, S)


def greedy_decode(model, cache, first: torch.Tensor, steps: int) -> list[int]:
    """Feed `first` (1, 1) and then each argmax token, one decode step at a time; the `steps` tokens made.

    The one generation loop's core (models.runtime.generation.greedy_tokens) from this prefilled cache:
    exactly `steps` tokens (no stop at end of text), ids only (the caller decodes the answer).
    """
    return list(itertools.islice(greedy_tokens(model, cache, first), steps))


@torch.no_grad()
def passkey_trials(model, tokenizer, context: int = 8192, trials: int = 5, budgets=(256, 512, 1024, 2048), *,
                   page_size: int = QUEST.page_size, share_selection: bool = QUEST.share_selection,
                   new_tokens: int = 8, seed: int = 0, dense_layers: int = QUEST.dense_layers, depths=None, progress=None,
                   setups: list[SparseSetup] | None = None) -> list[PasskeyResult]:
    """Run `trials` passkey prompts (depths spread over (0, 1)) for dense and each budget (or setup).

    depths: the needle depths to use instead (then `trials` = len(depths)); keys come from `seed`.
    setups: the settings to try (see SparseSetup); without them one per budget with page_size,
    share_selection and dense_layers (leading layers decoded densely; Quest: 2), their defaults the
    QUEST preset's (as SparseSetup's).
    progress(advance, description) is called after each (trial, setting). Leaves the model dense.
    """
    if depths is None:
        if trials < 1:
            raise GatherValueError(f"trials = {trials} must be >= 1")
        depths = [(t + 0.5) / trials for t in range(trials)]
    if setups is None:
        setups = setups_for_budgets(sorted(budgets), page_size=page_size, share_selection=share_selection,
                                    dense_layers=dense_layers)
    rng = random.Random(seed)
    results = []
    try:
        for trial, depth in enumerate(depths):
            key = str(rng.randint(10000, 99999))
            ids = passkey_prompt(tokenizer, context, depth, key)  # (1, S)
            use_sparse_decoding(model, budget=None, page_size=page_size)
            cache0, _ = prefill(model, ids[:, :-1], page_size)
            for setup in [SparseSetup(None, page_size=page_size, label="dense"), *setups]:
                results.append(_one_trial(model, tokenizer, cache0, ids, setup, new_tokens, trial, depth, key))
                if progress:
                    progress(1, f"passkey trial {trial + 1}/{len(depths)}")
    finally:
        use_dense_decoding(model)
    return results


def _one_trial(model, tokenizer, cache0, ids, setup: SparseSetup, new_tokens: int, trial: int, depth: float,
               key: str) -> PasskeyResult:
    """Greedy answer of one setting from a copy of the prefilled prompt."""
    use_sparse_decoding(model, budget=setup.budget, **setup.options())
    made = greedy_decode(model, repage(cache0, setup.page_size), ids[:, -1:], new_tokens)
    answer = tokenizer.decode(made)
    found = re.findall(r"\d{5}", answer)
    return PasskeyResult(setting=setup.name, budget=setup.budget, trial=trial, depth=round(depth, 3),
                         context=ids.shape[1], key=key, answer=answer, ok=bool(found) and found[0] == key)


def table_rows(report: SparseQualityReport | None, passkeys: list[PasskeyResult], budgets,
               setups: list[SparseSetup] | None = None) -> list[dict]:
    """The sparse table: the report's rows (or empty rows per setting) plus passkey_ok / passkey_trials.

        >>> table_rows(None, [], [64])[1]["setting"], table_rows(None, [], [64])[1]["passkey_trials"]
        ('budget=64', None)
    """
    if report is not None:
        rows = report.as_dicts()
    else:  # passkey only
        setups = setups if setups is not None else setups_for_budgets(budgets)
        rows = [{k: None for k in TABLE_COLUMNS} | {"setting": s.name, "budget": s.budget}
                for s in [SparseSetup(None), *setups]]
    for row in rows:
        mine = [p for p in passkeys if p.setting == row["setting"]]
        row["passkey_ok"] = sum(p.ok for p in mine) if mine else None
        row["passkey_trials"] = len(mine) if mine else None
    return rows
