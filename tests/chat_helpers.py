"""A tiny random Llama written to GGUF with a ChatML-like chat template over its own control tokens
(<s> opens a turn, </s> ends it): the chat plumbing (template, stop token, prefix reuse, the CLI, the
server) runs on it in a second, where SmolLM2-135M-Instruct needs a slow load."""
from __future__ import annotations

from pathlib import Path

from tiny_gguf import metadata, tensors, tiny_model, tokenizer, TINY

TEMPLATE = ("{% for m in messages %}{{ '<s>' + m['role'] + '\\n' + m['content'] + '</s>\\n' }}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<s>assistant\\n' }}{% endif %}")


def write_chat_model(path: Path, qtype: str = "Q8_0", seed: int = 0) -> Path:
    """tiny_gguf's llama (2 layers, hidden 64, vocabulary of 320) at `path`, with TEMPLATE as its
    tokenizer.chat_template."""
    import gguf

    model = tiny_model("llama", seed=seed)
    writer = gguf.GGUFWriter(str(path), "llama")
    metadata(writer, TINY["llama"], model.config)
    tokenizer(writer)
    writer.add_chat_template(TEMPLATE)
    tensors(writer, model, TINY["llama"], qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
