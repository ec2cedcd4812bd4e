"""Training a GPT: `python train.py`'s command (cli.py), the run's chain and loop, and one module for each
thing they use. Nothing runs at import time."""
