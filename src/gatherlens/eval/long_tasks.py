"""RULER-style long-context tasks made here, with real prose as the haystack.

    >>> hay = Haystack(lm.tokenizer, load_text("austen:emma"))
    >>> sample = make_sample(hay, length=4096, seed=3, tasks=GROUPS[0])   # a haystack with a group's needles
    >>> sample.prompt_ids.shape, [q.task for q in sample.questions]
    ((1, ~4000), ['niah_single', 'vt', 'cwe'])
    >>> score(sample.questions[0], " 4830192.")                  # share of the wanted answers found: 1.0

The tasks follow RULER (Hsieh et al., 2024), with a window of real text (Austen's novels, Python's
pydoc topics, any --text) as the haystack instead of repeated filler:

- niah_single: one needle "The special magic number for {key} is: {7 digits}."; asked for its number;
- niah_multikey: four needles of that kind with other keys (distractors); asked for one of them;
- niah_multivalue: four numbers for one key; asked for all of them;
- niah_multiquery: four needles with different keys; asked for two of them;
- vt (variable tracking): a chain "VAR A = 12345." then "VAR B = VAR A." ... spread through the text, and
  a distractor chain; asked which variables hold the value;
- cwe (common-word extraction, aggregation): ten words each said four times ("The word to count is X.")
  and ten others said once; asked for the ten most frequent.

A sample is two haystacks (GROUPS), each holding the needles of a group of tasks: the single needle,
the variable chains and the counted words (three kinds of sentence the model cannot mistake for one
another), then the three multi-needle tasks (the other numbers are distractors, as RULER's are).
Each question is asked after its group's prefilled context (eval/long_context.py forks the cache):
two prefills serve the six tasks.
Keys, values, depths and the haystack window come from one seeded generator: the samples are the
same on every run. A sample's score is the share of the wanted strings its answer holds (RULER's
string-match-all): 0 or 1 for the one-answer tasks.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

import torch

from gatherlens.errors import GatherValueError

__all__ = ["TASKS", "GROUPS", "Question", "Sample", "Haystack", "make_sample", "score", "ANSWER_TOKENS"]

TASKS = ("niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery", "vt", "cwe")
GROUPS = (("niah_single", "vt", "cwe"), ("niah_multikey", "niah_multivalue", "niah_multiquery"))  # one haystack each
ANSWER_TOKENS = {"niah_single": 12, "niah_multikey": 12, "niah_multivalue": 40, "niah_multiquery": 28,
                 "vt": 30, "cwe": 40}  # greedy tokens each task's answer may take

# the keys of the needles: plain English words the model can copy (distinct from the novels' names)
KEYS = ("apple", "river", "candle", "violet", "harbor", "marble", "thunder", "pepper", "saddle", "lantern",
        "meadow", "copper", "falcon", "velvet", "orchard", "compass", "glacier", "walnut", "canyon", "ember",
        "quartz", "willow", "anchor", "biscuit", "cobalt", "dolphin", "fossil", "garnet", "hammock", "igloo")
WORDS = ("zebra", "tulip", "kettle", "banjo", "cactus", "donut", "eagle", "fiddle", "gadget", "hippo", "iris",
         "jigsaw", "koala", "lemon", "mango", "noodle", "otter", "panda", "quill", "robin", "salsa", "tiger",
         "ukulele", "vortex", "waffle", "yacht", "zinnia", "acorn", "bongo", "cherry")
VARS = ("XQJ", "KZT", "PLM", "RWV", "BNC", "DFH", "GTY", "MQS", "VHX", "WZR", "JKL", "QPT")


@dataclass(frozen=True)
class Question:
    """One task's question on a sample: what is asked after the context, and the strings a right answer holds."""

    task: str
    text: str                  # the question and the answer's opening words, appended to the context
    wanted: tuple[str, ...]    # every string a full answer contains
    max_new: int               # greedy tokens the answer may take


@dataclass
class Sample:
    """A haystack window with every task's needles inserted, and one question per task."""

    length: int                # the context length asked for (tokens)
    seed: int
    prompt_ids: torch.Tensor   # (1, S) the context: haystack and needles, S about `length` minus the questions
    questions: list[Question] = field(default_factory=list)
    depths: dict = field(default_factory=dict)  # task -> relative depths (0..1) of its needles


class Haystack:
    """Real text cut into sentences, tokenized once: windows of it make the haystacks."""

    def __init__(self, tokenizer, text: str, min_sentences: int = 64):
        self.tokenizer = tokenizer
        parts = re.split(r"(?<=[.!?])\s+", " ".join(text.split()))  # sentences, whitespace made plain
        self.sentences = [p for p in parts if p]
        if len(self.sentences) < min_sentences:
            raise GatherValueError(f"the haystack text has {len(self.sentences)} sentences; give a longer text "
                                   f"(at least {min_sentences})")
        self.lengths = [len(self.encode(" " + s)) for s in self.sentences]
        self.total = sum(self.lengths)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def window(self, tokens: int, rng: random.Random) -> list[str]:
        """Consecutive sentences holding about `tokens` tokens, from a random start (wrapping around)."""
        if tokens > self.total:
            raise GatherValueError(f"the haystack text has {self.total} tokens; a context of {tokens} needs more "
                                   f"(give a longer --text or a shorter --lengths)")
        i, out, have = rng.randrange(len(self.sentences)), [], 0
        while have < tokens:
            out.append(self.sentences[i % len(self.sentences)])
            have += self.lengths[i % len(self.sentences)]
            i += 1
        return out


def _number(rng: random.Random, digits: int = 7) -> str:
    return str(rng.randrange(10 ** (digits - 1), 10 ** digits))


def _needles(rng: random.Random) -> tuple[dict[str, list[str]], list[Question]]:
    """Every task's needle sentences (task -> sentences, inserted in this order) and questions."""
    keys = rng.sample(KEYS, 12)
    words = rng.sample(WORDS, 20)
    magic = "The special magic number for {} is: {}."
    n = {t: [] for t in TASKS}
    q = []
    single = (keys[0], _number(rng))
    n["niah_single"] = [magic.format(*single)]
    q.append(Question("niah_single", f"What is the special magic number for {single[0]} mentioned in the text? "
                      f"The special magic number for {single[0]} mentioned in the text is", (single[1],),
                      ANSWER_TOKENS["niah_single"]))
    codes = [(k, _number(rng)) for k in keys[1:5]]
    n["niah_multikey"] = [f"The special magic code for {k} is: {v}." for k, v in codes]
    ask = rng.choice(codes)
    q.append(Question("niah_multikey", f"What is the special magic code for {ask[0]} mentioned in the text? "
                      f"The special magic code for {ask[0]} mentioned in the text is", (ask[1],),
                      ANSWER_TOKENS["niah_multikey"]))
    many = [_number(rng) for _ in range(4)]
    n["niah_multivalue"] = [f"One of the special magic values for {keys[5]} is: {v}." for v in many]
    q.append(Question("niah_multivalue", f"What are all the special magic values for {keys[5]} mentioned in the "
                      f"text? The special magic values for {keys[5]} mentioned in the text are", tuple(many),
                      ANSWER_TOKENS["niah_multivalue"]))
    ids = [(k, _number(rng)) for k in keys[6:10]]
    n["niah_multiquery"] = [f"The special magic id for {k} is: {v}." for k, v in ids]
    two = rng.sample(ids, 2)
    q.append(Question("niah_multiquery", f"What are the special magic ids for {two[0][0]} and {two[1][0]} mentioned "
                      f"in the text? The special magic ids for {two[0][0]} and {two[1][0]} mentioned in the text are",
                      (two[0][1], two[1][1]), ANSWER_TOKENS["niah_multiquery"]))
    n["vt"], wanted, value = _chains(rng)
    q.append(Question("vt", f"Find all variables that are assigned the value {value} in the text. Answer: "
                      f"According to the chain of variable assignments in the text, {len(wanted)} variables are "
                      f"assigned the value {value}, they are:", wanted, ANSWER_TOKENS["vt"]))
    n["cwe"] = [f"The word to count is {w}." for w in words[:10] for _ in range(4)] + \
               [f"The word to count is {w}." for w in words[10:]]
    rng.shuffle(n["cwe"])
    q.append(Question("cwe", "Of the words to count in the text, which ten were said most often? Answer: the ten "
                      "words said most often are:", tuple(words[:10]), ANSWER_TOKENS["cwe"]))
    return n, q


def _chains(rng: random.Random) -> tuple[list[str], tuple[str, ...], str]:
    """Variable tracking: a chain of 5 variables holding one value and a distractor chain of 3 (in order)."""
    names = rng.sample(VARS, 8)
    value, other = _number(rng, 5), _number(rng, 5)
    chain = [f"VAR {names[0]} = {value}."] + [f"VAR {names[i]} = VAR {names[i - 1]}." for i in range(1, 5)]
    decoy = [f"VAR {names[5]} = {other}."] + [f"VAR {names[i]} = VAR {names[i - 1]}." for i in range(6, 8)]
    merged, a, b = [], 0, 0  # interleaved, each chain in its own order
    while a < len(chain) or b < len(decoy):
        take_chain = b >= len(decoy) or (a < len(chain) and rng.random() < 0.6)
        merged.append(chain[a] if take_chain else decoy[b])
        a, b = (a + 1, b) if take_chain else (a, b + 1)
    return merged, tuple(names[:5]), value


def make_sample(hay: Haystack, length: int, seed: int, tasks=TASKS) -> Sample:
    """A haystack of about `length` tokens (the questions' tokens included) with the needles of `tasks`
    inserted between its sentences at seeded random depths, each task's needles in their own order.
    The same (length, seed, tasks) makes the same sample."""
    rng = random.Random(f"{length}-{seed}-{','.join(tasks)}")
    needles, questions = _needles(rng)
    questions = [q for q in questions if q.task in tasks]
    room = length - sum(len(hay.encode(" " + s)) for t in tasks for s in needles[t]) - \
        max(len(hay.encode("\n\n" + q.text)) + q.max_new for q in questions) - 8
    if room < 64:
        raise GatherValueError(f"a context of {length} tokens leaves no room for a haystack around the needles")
    sentences = hay.window(room, rng)
    placed, depths = {}, {}
    for t in tasks:  # a task's needles take seeded random gaps between sentences, in their own order
        slots = sorted(rng.randrange(len(sentences) + 1) for _ in needles[t])
        for slot, sentence in zip(slots, needles[t]):
            placed.setdefault(slot, []).append(sentence)
        depths[t] = [round(slot / len(sentences), 3) for slot in slots]
    out = []
    for i in range(len(sentences) + 1):
        out += placed.get(i, [])
        out += [sentences[i]] if i < len(sentences) else []
    ids = torch.tensor([hay.encode(" ".join(out))], dtype=torch.long)  # (1, S)
    return Sample(length, seed, ids, questions, depths)


def score(question: Question, answer: str) -> float:
    """The share of the question's wanted strings found in `answer` (whole words, any case).

        >>> score(Question("vt", "", ("XQJ", "KZT"), 8), " XQJ, KZT and PLM")
        1.0
    """
    found = sum(bool(re.search(rf"(?<![\w]){re.escape(w)}(?![\w])", answer, re.IGNORECASE))
                for w in question.wanted)
    return found / len(question.wanted)
