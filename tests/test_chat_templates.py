"""Chat templates (models/runtime/chat.py) against transformers' own apply_chat_template.

Real templates (tests/data/chat_templates: Gemma 2, Llama 3, Phi-3, Qwen3) ride in tiny GGUFs whose
vocabulary holds each family's control tokens; the shipped SmolLM2-135M-Instruct GGUF carries its own.
Text and token ids must equal transformers' rendering of the same tokenizer, a refusal must be refused
alike, and each template's own end-of-turn token must be among the stop ids.
"""
from __future__ import annotations

import types
from pathlib import Path

import pytest

from gatherlens.errors import GatherTypeError, GatherValueError
from gatherlens.models.runtime.chat import ChatTemplate, chat_prompt, chat_template_of, check_messages
from tiny_gguf import MERGES, byte_tokens

DATA = Path(__file__).parent / "data" / "chat_templates"
CONTROL, USER_DEFINED = 3, 4

# family -> (template file, control tokens, user-defined tokens, bos, eos, the template's end of a turn)
FAMILIES = {
    "gemma": ("gemma-2-it.jinja", ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"], [],
              "<bos>", "<eos>", "<end_of_turn>"),
    "llama3": ("llama3-8b-instruct.jinja", ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                                            "<|end_header_id|>", "<|eot_id|>"], [],
               "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"),
    "phi3": ("phi-3-mini-4k-instruct.jinja", ["<s>", "<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>",
                                              "<|end|>"], [], "<s>", "<|endoftext|>", "<|end|>"),
    "qwen3": ("qwen3-4b-thinking.jinja", ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
              ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"],
              None, "<|im_end|>", "<|im_end|>"),
}

CHATS = {
    "one turn": [{"role": "user", "content": "What is a gather?"}],
    "system": [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Sky colour?"}],
    "turns": [{"role": "user", "content": "  Hi there  "}, {"role": "assistant", "content": "Hello! How can I help?"},
              {"role": "user", "content": "Name a prime, 中文 too."}],
    "ends on assistant": [{"role": "user", "content": "Say A"}, {"role": "assistant", "content": "A"}],
}

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
TOOL_CHAT = [{"role": "system", "content": "You help."}, {"role": "user", "content": "Weather in Paris?"},
             {"role": "assistant", "content": "", "reasoning_content": "Call the tool.",
              "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
             {"role": "tool", "content": "{\"sky\": \"clear\"}"}, {"role": "user", "content": "Thanks"},
             {"role": "assistant", "content": "<think>\nok\n</think>\n\nYou are welcome.", "tool_calls": None}]


def write_chat_gguf(path: Path, family: str) -> Path:
    """A tokenizer-only GGUF: byte-level BPE (tiny_gguf's bytes and merges), the family's control and
    user-defined tokens, its BOS/EOS and the real template as tokenizer.chat_template."""
    import gguf

    file, control, user, bos, eos, _ = FAMILIES[family]
    tokens = byte_tokens() + [m.replace(" ", "") for m in MERGES] + control + user
    types_ = [1] * (len(tokens) - len(control) - len(user)) + [CONTROL] * len(control) + [USER_DEFINED] * len(user)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_merges(MERGES)
    writer.add_token_types(types_)
    if bos is not None:
        writer.add_bos_token_id(tokens.index(bos))
    writer.add_eos_token_id(tokens.index(eos))
    writer.add_chat_template((DATA / file).read_text())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    from gatherlens.models.gguf.config import open_gguf
    from gatherlens.models.gguf.tokenizer import gguf_tokenizer

    path = write_chat_gguf(tmp_path_factory.mktemp("chat") / f"{request.param}.gguf", request.param)
    tokenizer = gguf_tokenizer(open_gguf(path))
    assert tokenizer.chat_template == (DATA / FAMILIES[request.param][0]).read_text()
    return request.param, types.SimpleNamespace(tokenizer=tokenizer, name=request.param, model=None,
                                                encode=lambda text, **kw: tokenizer(text, return_tensors="pt", **kw)[
                                                    "input_ids"])


def _theirs(tokenizer, chat, **kw):
    """transformers' rendering (text) and ids, or the exception it raised."""
    try:
        text = tokenizer.apply_chat_template(chat, tokenize=False, **kw)
        out = tokenizer.apply_chat_template(chat, tokenize=True, **kw)
    except Exception as e:  # noqa: BLE001 (the template's own refusal)
        return e, None
    return text, list(out["input_ids"] if hasattr(out, "keys") else out)


@pytest.mark.parametrize("generation", [True, False], ids=["generation prompt", "no generation prompt"])
@pytest.mark.parametrize("chat", sorted(CHATS))
def test_real_templates_render_as_transformers_does(family, chat, generation):
    name, lm = family
    template = chat_template_of(lm)
    text, ids = _theirs(lm.tokenizer, CHATS[chat], add_generation_prompt=generation)
    if isinstance(text, Exception):   # Gemma refuses a system message: so do we, with its words
        with pytest.raises(GatherValueError, match=f"the chat template of {name} refused the conversation: "
                                                   f"{str(text)[:20]}"):
            template.render(CHATS[chat], add_generation_prompt=generation)
        return
    assert template.render(CHATS[chat], add_generation_prompt=generation) == text
    assert chat_prompt(lm, CHATS[chat], template, generation)[0].tolist() == ids


def test_qwen3_tools_and_reasoning_render_as_transformers_does(family):
    name, lm = family
    if name != "qwen3":
        pytest.skip("the tool-calling template is Qwen3's")
    template = chat_template_of(lm)
    for generation in (True, False):
        text, ids = _theirs(lm.tokenizer, TOOL_CHAT, tools=TOOLS, add_generation_prompt=generation)
        assert template.render(TOOL_CHAT, tools=TOOLS, add_generation_prompt=generation) == text
        assert "<tool_call>" in text and '"city": "Paris"' in text and "<tool_response>" in text


def test_each_template_stops_at_its_own_end_of_turn(family):
    name, lm = family
    template = chat_template_of(lm)
    turn_end = FAMILIES[name][5]
    end_id = lm.tokenizer.convert_tokens_to_ids(turn_end)
    eos_id = lm.tokenizer.convert_tokens_to_ids(FAMILIES[name][4])
    assert template.stop_ids == {end_id, eos_id}


@pytest.mark.slow
@pytest.mark.parametrize("quantized", [False, True], ids=["float", "quantized"])
def test_smollm2_instruct_renders_as_transformers_does(quantized):
    import gatherlens

    lm = gatherlens.load("smollm2", quantized=quantized)
    template = chat_template_of(lm)
    assert template.source == lm.tokenizer.chat_template and "<|im_start|>" in template.source
    for chat in CHATS.values():
        for generation in (True, False):
            text, ids = _theirs(lm.tokenizer, chat, add_generation_prompt=generation)
            assert template.render(chat, add_generation_prompt=generation) == text
            assert chat_prompt(lm, chat, template, generation)[0].tolist() == ids
    assert template.stop_ids == {lm.tokenizer.convert_tokens_to_ids("<|im_end|>")}


def test_the_sandbox_and_helpers_follow_transformers():
    special = {"bos_token": "<s>", "eos_token": "</s>"}
    t = ChatTemplate("{{ messages | tojson }}|{{ dict(a=1) | tojson }}|{% set ns = namespace(n=0) %}"
                     "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{% set ns.n = ns.n + 1 %}"
                     "{% endfor %}{{ ns.n }}|{% generation %}{{ bos_token }}{% endgeneration %}|"
                     "{{ strftime_now('%Y') | length }}", special)
    chat = [{"role": "user", "content": "<b>é</b>", "name": None}, {"role": "user", "content": "x"}]
    assert t.render(chat) == ('[{"role": "user", "content": "<b>é</b>"}, {"role": "user", "content": "x"}]'
                              '|{"a": 1}|1|<s>|4')
    with pytest.raises(GatherValueError, match="cannot store '_x' on a namespace"):
        ChatTemplate("{% set ns = namespace(_x=1) %}", special).render(chat)
    with pytest.raises(GatherValueError, match="refused the conversation: .*unsafe|access to attribute"):
        ChatTemplate("{{ messages.__class__.__mro__ }}", special).render(chat)
    with pytest.raises(GatherValueError, match="the chat template of the model cannot be read: line 1"):
        ChatTemplate("{% for %}", special)


def test_bad_conversations_name_the_message():
    with pytest.raises(GatherValueError, match="messages must be a non-empty list"):
        check_messages([])
    with pytest.raises(GatherTypeError, match=r"messages\[1\] must be a dict"):
        check_messages([{"role": "user", "content": "a"}, "b"])
    with pytest.raises(GatherValueError, match=r"messages\[0\].role must be a non-empty string, got 5"):
        check_messages([{"role": 5, "content": "a"}])


def test_a_model_without_a_template_is_refused():
    lm = types.SimpleNamespace(tokenizer=types.SimpleNamespace(chat_template=None), name="plain", model=None)
    with pytest.raises(GatherValueError, match="model 'plain' has no chat template"):
        chat_template_of(lm)
