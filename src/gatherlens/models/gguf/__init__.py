"""GGUF files read directly: architectures, checks, config, tokenizer, float weights and the quantized build."""
