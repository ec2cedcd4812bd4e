"""The checkpoint: the one place that names, writes and reads checkpoint files.

- format.py: the file names, the payload's schema and version, the storage backends (one file written
  atomically, or a sharded directory: sharded.py, torch.distributed.checkpoint), safe reading;
- a training run's side: out_dir.py claims the out_dir (one trainer, leftovers removed); resume.py decides
  whether and from what to resume (the best-checkpoint rule among it); checkpointer.py saves and restores
  every registered stateful part;
- load.py: inference's side: a model from a checkpoint, an out_dir, an HF directory or a hub name; meta.py:
  the empty model (meta device, no init) that a checkpoint's or an HF directory's tensors fill;
- locate.py: which checkpoint a script means by default, and the files it is made of;
- __main__.py: `python -m checkpoint consolidate <out_dir>`: a sharded checkpoint as one file.

It imports model/ (to build a GPT) and never training/: training registers its parts with it, and
inference asks it for a model.
"""
from lazy import exports_on_first_use

_EXPORTS = {  # each name and the module it lives in: imported on first use (lazy.py)
    "BEST_NAME": "format", "CKPT_NAME": "format", "FORMAT": "format", "SCHEMA": "format",
    "SHARDED_BEST_NAME": "format", "SHARDED_CKPT_NAME": "format", "VERSION": "format", "find_checkpoint": "format",
    "load_checkpoint": "format", "resolve_checkpoint_path": "format", "save_checkpoint": "format",
    "LoadedModel": "load", "check_source": "load", "is_hf_dir": "load", "is_hub_name": "load",
    "load_for_inference": "load", "load_model": "load", "model_config_dict": "load", "model_from_checkpoint": "load",
    "checkpoint_dirs": "locate", "checkpoint_files": "locate", "default_checkpoint": "locate",
    "Checkpointer": "checkpointer", "claim_out_dir": "out_dir", "Resume": "resume", "decide_resume": "resume",
    "no_resume_advice": "resume",
}

__all__ = [
    "BEST_NAME", "CKPT_NAME", "FORMAT", "SCHEMA", "SHARDED_BEST_NAME", "SHARDED_CKPT_NAME", "VERSION", "Checkpointer",
    "LoadedModel", "Resume", "check_source", "checkpoint_dirs", "checkpoint_files", "claim_out_dir", "decide_resume",
    "default_checkpoint", "find_checkpoint", "is_hf_dir", "is_hub_name", "load_checkpoint", "load_for_inference",
    "load_model", "model_config_dict", "model_from_checkpoint", "no_resume_advice", "resolve_checkpoint_path",
    "save_checkpoint",
]


__getattr__ = exports_on_first_use(__name__, _EXPORTS)  # (lazy.py: why)
