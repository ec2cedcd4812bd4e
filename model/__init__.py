from .gpt import GPT, GPTConfig, KVCache

__all__ = ["GPT", "GPTConfig", "KVCache"]
