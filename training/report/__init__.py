"""What a run reports: the console, progress and metrics.jsonl (metrics.py), the log window each record
averages (window.py), wandb (wandb_logger.py), the samples and attention maps (showcase.py), MFU (mfu.py), what
each rank holds (state_size.py), and the eval losses (evaluate.py)."""
