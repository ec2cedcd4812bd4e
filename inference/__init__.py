"""The terminal's inference commands behind the thin scripts: `python sample.py` (sample_cli.py, its prompts
in prompts.py) and `python chat.py` (chat_cli.py). They load a model through checkpoint/, so they stand above
it and cannot live in runtime/, which checkpoint/ imports; they never import training/."""
