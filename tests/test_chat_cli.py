"""`gatherlens chat` and `generate --chat` / the sampling options, with click's runner, on a tiny GGUF chat model
(tests/chat_helpers.py: a random 2-layer Llama whose template wraps turns in <s> ... </s>)."""
from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner

from chat_helpers import write_chat_model
from gatherlens.cli import main
from gatherlens.models import load
from gatherlens.models.runtime.chat import chat_prompt, chat_template_of
from gatherlens.models.runtime.generation import GenerationEnd, generation_steps
from gatherlens.ops.sampling import SamplingConfig
from gatherlens.ops.sparse.config import DEFAULT


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_chat_model(tmp_path_factory.mktemp("chatcli") / "chat.gguf")


@pytest.fixture(scope="module")
def lm(model):
    return load(str(model), quantized=True, progress=False)


def _answer(lm, chat, sampling=None, n=12):
    template = chat_template_of(lm)
    ids = chat_prompt(lm, chat, template)
    events = list(generation_steps(lm, ids, DEFAULT.budget, n, sampling=sampling, stop=template.stop_ids))
    return next(e for e in events if isinstance(e, GenerationEnd)).text


def test_chat_streams_answers_keeps_history_and_resets(model, lm):
    res = CliRunner().invoke(main, ["chat", "--model", str(model), "--quantized", "--temperature", "0",
                                    "--max-new-tokens", "12"], input="the cat\nand the dog\n/reset\nthe cat\n/exit\n")
    assert res.exit_code == 0, res.output
    first = _answer(lm, [{"role": "user", "content": "the cat"}])
    second = _answer(lm, [{"role": "user", "content": "the cat"}, {"role": "assistant", "content": first},
                          {"role": "user", "content": "and the dog"}])
    assert res.stdout == f"{first}\n{second}\n{first}\n"     # the third turn: history forgotten by /reset
    assert "(conversation forgotten)" in res.stderr


def test_chat_samples_with_a_seed_and_ends_at_end_of_input(model):
    args = ["chat", "--model", str(model), "--quantized", "--seed", "7", "--max-new-tokens", "10"]
    one = CliRunner().invoke(main, args, input="hello there\n")
    two = CliRunner().invoke(main, args, input="hello there\n")
    assert one.exit_code == 0 and one.stdout == two.stdout and one.stdout.strip()
    other = CliRunner().invoke(main, args[:-3] + ["8", "--max-new-tokens", "10"], input="hello there\n")
    assert other.stdout != one.stdout


def test_generate_chat_uses_the_template_and_its_stop(model, lm):
    res = CliRunner().invoke(main, ["generate", "the cat", "--chat", "--system", "be short", "--model", str(model),
                                    "--quantized", "--max-new-tokens", "12"])
    assert res.exit_code == 0, res.output
    want = _answer(lm, [{"role": "system", "content": "be short"}, {"role": "user", "content": "the cat"}])
    assert res.stdout == want + "\n"


def test_generate_samples_only_when_asked(model, lm):
    base = ["generate", "the cat sat", "--model", str(model), "--quantized", "--max-new-tokens", "10"]
    greedy = CliRunner().invoke(main, base)
    ids = lm.encode("the cat sat")
    events = list(generation_steps(lm, ids, DEFAULT.budget, 10))
    assert greedy.stdout == events[-1].text + "\n"
    seeded = [CliRunner().invoke(main, base + ["--temperature", "1.5", "--seed", "3"]).stdout for _ in range(2)]
    assert seeded[0] == seeded[1]
    config = SamplingConfig(temperature=1.5, seed=3)
    assert seeded[0] == list(generation_steps(lm, ids, DEFAULT.budget, 10, sampling=config))[-1].text + "\n"


@pytest.mark.parametrize("args, words", [
    (["--top-p", "0"], "--top-p = 0.0 is outside the valid range (0, 1]"),
    (["--temperature", "-1"], "--temperature = -1.0 is outside the valid range [0, 1000]"),
    (["--top-k", "-2"], "--top-k = -2 is outside the valid range [0, inf)"),
    (["--seed", "x"], "--seed = 'x' is not an integer"),
    (["--system", "s"], "--system needs --chat"),
])
def test_bad_sampling_options_are_one_error(model, args, words):
    res = CliRunner().invoke(main, ["generate", "a", "--model", str(model)] + args)
    assert res.exit_code == 2 and words in res.output, res.output


def test_a_model_without_a_template_cannot_chat(tmp_path):
    from tiny_gguf import tiny_model, write_gguf

    plain = write_gguf(tiny_model("llama"), "llama", "Q8_0", tmp_path / "plain.gguf")
    res = CliRunner().invoke(main, ["generate", "a", "--chat", "--model", str(plain), "--quantized"])
    assert res.exit_code == 1 and "has no chat template" in res.output
    res = CliRunner().invoke(main, ["chat", "--model", str(plain), "--quantized"], input="hi\n")
    assert res.exit_code == 1 and "has no chat template" in res.output


def test_the_sampler_of_the_loop_keeps_the_prompt_for_its_penalties(lm):
    ids = torch.tensor([[5, 6, 7, 8]])
    config = SamplingConfig(repeat_penalty=100.0)   # greedy, but no token of the prompt or answer again
    new = list(generation_steps(lm, ids, DEFAULT.budget, 8, sampling=config, stop=()))[-1].new_ids
    assert not set(new) & {5, 6, 7, 8} and len(set(new)) == len(new)
