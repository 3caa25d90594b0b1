"""Chat templates: a model's own conversation format, rendered as transformers' `apply_chat_template` renders it.

    >>> template = chat_template_of(lm)                        # the GGUF's tokenizer.chat_template (or the HF one)
    >>> template.render([{"role": "user", "content": "Hi"}])
    '<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n'
    >>> ids = chat_prompt(lm, messages)                        # (1, S) ids of that text, no tokenizer BOS/EOS added
    >>> template.stop_ids                                      # {2}: <|im_end|>, the template's end of a turn, + EOS

The template is Jinja run in jinja2's `ImmutableSandboxedEnvironment` with the settings and helpers
transformers gives it (utils/chat_template_utils.py, 5.x): trim_blocks, lstrip_blocks, loop controls,
a `{% generation %}` block (its body rendered as is), the `tojson` filter without HTML escaping,
`raise_exception`, `strftime_now`, a `dict` and a `namespace` that refuse underscore names. It sees
`messages` (plain JSON data, keys whose value is None dropped, a message's reasoning under both
`reasoning_content` and `thinking`), `add_generation_prompt`, `tools`,
`documents` and the tokenizer's special tokens (`bos_token`, `eos_token`, ...), as transformers
passes them. The text is tokenized without adding special tokens: the template writes its own BOS.

A template ends an assistant turn with its own token (ChatML's <|im_end|>, Llama 3's <|eot_id|>,
Gemma's <end_of_turn>, Phi-3's <|end|>), which is not always the model's EOS; `stop_ids` finds it by
rendering a probe conversation and reading the first special token after the assistant's text.
A template that refuses a conversation (raise_exception) or cannot be read is one GatherValueError.
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from datetime import datetime

from gatherlens.errors import GatherTypeError, GatherValueError, shorten

__all__ = ["ChatTemplate", "chat_template_of", "chat_prompt", "check_messages"]

_PROBE = "gatherlens-probe-7f3a"   # an assistant message's text, to find what the template writes after it
_REASONING = ("reasoning_content", "thinking", "reasoning")   # a message's reasoning, by the names it comes under


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message):
    import jinja2

    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(format):
    return datetime.now().strftime(format)


@functools.cache
def _environment():
    """The sandboxed Jinja environment every template compiles in (transformers' settings and helpers)."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        """`{% generation %}...{% endgeneration %}`: the body as is (transformers marks assistant tokens with it)."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    class TemplateDict:
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                _check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            _check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

    def _check_name(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"a chat template cannot store {name!r} on a namespace")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now, dict=TemplateDict(),
                       namespace=TemplateNamespace)
    return env


def _plain(value):
    """value as plain JSON data (what transformers lets a template see; anything else is '<TypeName>')."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    for kind in (bool, str, int, float):
        if isinstance(value, kind):
            return kind(value) if kind is not bool else bool(value)
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    return f"<{type(value).__name__}>"


def check_messages(messages) -> list[dict]:
    """The conversation as the template sees it: a list of dicts, each with a string `role`; keys whose
    value is None dropped (as transformers does); a GatherValueError naming the message otherwise."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise GatherValueError(f"messages must be a non-empty list of {{'role': ..., 'content': ...}} dicts, "
                               f"got {shorten(messages)}")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise GatherTypeError(f"messages[{i}] must be a dict with 'role' and 'content', got "
                                  f"{type(message).__name__} {shorten(message)}")
        if not isinstance(message.get("role"), str) or not message["role"]:
            raise GatherValueError(f"messages[{i}].role must be a non-empty string, got {shorten(message.get('role'))}")
        message = {k: _plain(v) for k, v in message.items() if v is not None}
        reasoning = next((message[k] for k in _REASONING if message.get(k) is not None), None)
        if reasoning is not None:   # transformers gives a message's reasoning under both names templates read
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


@dataclass
class ChatTemplate:
    """A compiled chat template with the special tokens it is rendered with (see the module doc)."""

    source: str
    special_tokens: dict
    name: str = "the model"
    stop_ids: frozenset = frozenset()   # filled by chat_template_of: the template's turn end and the EOS ids

    def __post_init__(self):
        import jinja2

        try:
            self.compiled = _environment().from_string(self.source)
        except jinja2.exceptions.TemplateSyntaxError as e:
            raise GatherValueError(f"the chat template of {self.name} cannot be read: line {e.lineno}: {e.message}") \
                from None

    def render(self, messages, add_generation_prompt: bool = True, tools=None, documents=None, **kwargs) -> str:
        """The conversation as text, as `tokenizer.apply_chat_template(messages, tokenize=False, ...)` gives it."""
        import jinja2

        chat = check_messages(messages)
        variables = {**self.special_tokens, **_plain(kwargs)}
        try:
            return self.compiled.render(messages=chat, tools=_plain(tools), documents=_plain(documents),
                                        add_generation_prompt=bool(add_generation_prompt), **variables)
        except jinja2.exceptions.TemplateError as e:
            raise GatherValueError(f"the chat template of {self.name} refused the conversation: {e}") from None

    def turn_end(self) -> str | None:
        """The text the template writes right after an assistant's message (None if it cannot say)."""
        probe = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": _PROBE}]
        try:
            text = self.render(probe, add_generation_prompt=False)
        except GatherValueError:
            return None
        at = text.rfind(_PROBE)
        return None if at < 0 else text[at + len(_PROBE):]


def _special_tokens(tokenizer) -> dict:
    """The variables a template gets from the tokenizer: its special tokens by name (transformers'
    `special_tokens_map`)."""
    return dict(getattr(tokenizer, "special_tokens_map", {}) or {})


def _stop_ids(tokenizer, template: ChatTemplate, eos: set[int]) -> frozenset:
    """The EOS ids and the first special token the template writes after an assistant's message."""
    after = template.turn_end()
    stops = set(eos)
    if after:
        ids = tokenizer(after, add_special_tokens=False)["input_ids"]
        special = set(getattr(tokenizer, "all_special_ids", ()) or ())
        added = getattr(tokenizer, "added_tokens_decoder", {})
        special |= {i for i, t in added.items() if getattr(t, "special", False)}
        if ids and ids[0] in special:
            stops.add(int(ids[0]))
    return frozenset(stops)


def chat_template_of(lm, source: str | None = None) -> ChatTemplate:
    """The model's chat template (its tokenizer's `chat_template`: a GGUF's tokenizer.chat_template,
    an HF folder's tokenizer_config.json), or `source`; a GatherValueError when it has none."""
    from gatherlens.models.runtime.generation import stop_ids

    tokenizer, name = lm.tokenizer, getattr(lm, "name", "the model")
    text = source if source is not None else getattr(tokenizer, "chat_template", None)
    if isinstance(text, dict):   # several named templates: transformers' default is "default"
        text = text.get("default")
    if not isinstance(text, str) or not text.strip():
        raise GatherValueError(f"model {name!r} has no chat template (its tokenizer's chat_template, a GGUF's "
                               f"tokenizer.chat_template): prompt it with plain text instead")
    template = ChatTemplate(text, _special_tokens(tokenizer), name)
    template.stop_ids = _stop_ids(tokenizer, template, stop_ids(lm))
    return template


def chat_prompt(lm, messages, template: ChatTemplate | None = None, add_generation_prompt: bool = True):
    """The conversation's prompt ids (1, S): the template's text, tokenized without added special tokens."""
    template = template or chat_template_of(lm)
    return lm.encode(template.render(messages, add_generation_prompt=add_generation_prompt), add_special_tokens=False)
