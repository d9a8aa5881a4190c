"""Stack names as toolproxy spells them (records, `--stack`), and how to say them to a person."""

STACKS = ("ollama", "llamacpp", "vllm", "sglang", "lmstudio", "openai")

LABELS = {
    "ollama": "Ollama",
    "llamacpp": "llama.cpp (llama-server)",
    "vllm": "vLLM",
    "sglang": "SGLang",
    "lmstudio": "LM Studio",
    "openai": "an OpenAI-compatible server",
    "unknown": "an unidentified server",
    "unreachable": "an unreachable server",
}
