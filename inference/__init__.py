"""The terminal's inference commands behind the thin scripts: `python sample.py` (sample_cli.py, its prompts
in prompts.py) and `python chat.py` (chat_cli.py, the conversation and its KV cache in chat_session.py, the
terminal and piped modes in chat_terminal.py). They load a model through checkpoint/, so they stand above it
and cannot live in runtime/, which checkpoint/ imports; they never import training/."""
