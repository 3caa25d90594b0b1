"""`gatherlens chat`: talk to a model in the terminal, through its own chat template, answers streamed.

    gatherlens chat --quantized                       # SmolLM2-135M-Instruct from its GGUF
    gatherlens chat --system "Answer in one line." --temperature 0.7 --seed 1
    echo "What is a gather?" | gatherlens chat        # one question from a pipe, the answer on stdout

Each line you type is a user's message; the whole conversation so far goes through the model's chat
template (models/runtime/chat.py) and the answer streams as it is generated, ending at the template's
end of turn. The kept pages of the conversation's KV cache (models/runtime/prefix.py) are reused: a
turn prefills only what is new. `/reset` forgets the conversation, `/exit` (or Ctrl-D) leaves; Ctrl-C
stops an answer (what it said so far stays in the history). Sampling follows llama.cpp's defaults
(temperature 0.8, top-k 40, top-p 0.95, min-p 0.05) unless told otherwise; `--temperature 0` is greedy.
"""
from __future__ import annotations

import sys

import click

from gatherlens.commands.params import (
    Int, load_kwargs, quantized_option, require_causal, sampling_options, threads_option,
)
from gatherlens.ops.sampling.config import LLAMA_CPP

COMMANDS = {"/exit": "leave", "/quit": "leave", "/reset": "forget the conversation", "/help": "these commands"}


@click.command("chat")
@click.option("--model", "model_name", default="smollm2", show_default=True,
              help='"smollm2" or a local folder / .gguf file whose tokenizer has a chat template.')
@quantized_option()
@click.option("--system", default=None, help="A system message that opens the conversation.")
@click.option("--max-new-tokens", default=256, show_default=True, type=Int(1), help="Most tokens of one answer.")
@threads_option
@sampling_options(LLAMA_CPP)
def chat(model_name, quantized, system, max_new_tokens, threads, sampling=LLAMA_CPP):
    """Chat with a model in the terminal (its chat template, streamed answers, the conversation kept)."""
    from gatherlens.errors import GatherLensError

    load_kw = load_kwargs(model_name, quantized)
    require_causal(model_name, "chat")   # an encoder, a missing or damaged model: one line, before it loads
    try:
        session = _Session.start(model_name, load_kw, system, max_new_tokens, sampling, threads)
        _loop(session)
    except GatherLensError as e:
        raise click.ClickException(str(e)) from None


def _read(interactive: bool) -> str | None:
    """The next line of input (None at its end); the prompt only when a person types."""
    if interactive:
        click.echo(click.style("> ", bold=True), nl=False, err=True)
    line = sys.stdin.readline()
    return None if line == "" else line.rstrip("\n")


def _loop(session) -> None:
    interactive = sys.stdin.isatty()
    if interactive:
        click.echo(f"chatting with {session.lm.name}; /help lists the commands", err=True)
    while True:
        try:
            line = _read(interactive)
        except KeyboardInterrupt:
            line = None
        if line is None or line.strip() in ("/exit", "/quit"):
            return
        if line.strip() == "/help":
            click.echo("\n".join(f"{c:7} {what}" for c, what in COMMANDS.items()), err=True)
        elif line.strip() == "/reset":
            session.reset()
            click.echo("(conversation forgotten)", err=True)
        elif line.strip():
            session.answer(line, _write)
            click.echo("")


def _write(piece: str) -> None:
    sys.stdout.write(piece)
    sys.stdout.flush()


class _Session:
    """The model, its template, the conversation and its kept cache."""

    @classmethod
    def start(cls, model_name: str, load_kw: dict, system: str | None, max_new_tokens: int, sampling, threads):
        from gatherlens.models import load
        from gatherlens.models.runtime.chat import chat_template_of
        from gatherlens.models.runtime.generation import require_causal
        from gatherlens.models.runtime.threads import fix_threads

        if threads:
            fix_threads(threads)
        self = cls()
        self.lm = load(model_name, progress=True, **load_kw)
        require_causal(self.lm)
        self.template = chat_template_of(self.lm)
        self.system, self.max_new_tokens, self.sampling = system, max_new_tokens, sampling
        self.reset()
        return self

    def reset(self) -> None:
        from gatherlens.models.runtime.prefix import Conversation

        self.messages = [{"role": "system", "content": self.system}] if self.system else []
        self.conversation = Conversation(self.lm)

    def answer(self, text: str, write) -> None:
        """One turn: the user's text in, the answer streamed to write(piece) and kept in the history."""
        from gatherlens.models.runtime.chat import chat_prompt

        self.messages.append({"role": "user", "content": text})
        ids = chat_prompt(self.lm, self.messages, self.template)
        reply = []
        try:
            for piece in self.conversation.stream(ids, self.max_new_tokens, self.sampling, self.template.stop_ids):
                reply.append(piece)
                write(piece)
        except KeyboardInterrupt:
            write(" [stopped]")
        self.messages.append({"role": "assistant", "content": "".join(reply)})
