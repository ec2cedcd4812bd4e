"""Training checkpoints: see model/checkpoint.py for the file format (shared with inference)."""
from model.checkpoint import BEST_NAME, CKPT_NAME, load_checkpoint, model_config_dict, save_checkpoint

__all__ = ["BEST_NAME", "CKPT_NAME", "load_checkpoint", "model_config_dict", "save_checkpoint"]
