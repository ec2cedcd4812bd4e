"""Training helpers for train.py: each module does one thing. Nothing runs at import time."""
