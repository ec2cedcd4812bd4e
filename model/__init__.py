from .gpt import GPT, GPTConfig, KVCache
from .hf import from_pretrained

__all__ = ["GPT", "GPTConfig", "KVCache", "from_pretrained"]
