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
from .format import (
    BEST_NAME, CKPT_NAME, FORMAT, SCHEMA, SHARDED_BEST_NAME, SHARDED_CKPT_NAME, VERSION, find_checkpoint, load_checkpoint,
    resolve_checkpoint_path, save_checkpoint,
)
from .load import (
    LoadedModel, check_source, is_hf_dir, is_hub_name, load_for_inference, load_model, model_config_dict, model_from_checkpoint,
)
from .locate import checkpoint_dirs, checkpoint_files, default_checkpoint
from .checkpointer import Checkpointer
from .out_dir import claim_out_dir
from .resume import Resume, decide_resume, no_resume_advice

__all__ = [
    "BEST_NAME", "CKPT_NAME", "FORMAT", "SCHEMA", "SHARDED_BEST_NAME", "SHARDED_CKPT_NAME", "VERSION", "Checkpointer",
    "LoadedModel", "Resume", "check_source", "checkpoint_dirs", "checkpoint_files", "claim_out_dir", "decide_resume",
    "default_checkpoint", "find_checkpoint", "is_hf_dir", "is_hub_name", "load_checkpoint", "load_for_inference",
    "load_model", "model_config_dict", "model_from_checkpoint", "no_resume_advice", "resolve_checkpoint_path",
    "save_checkpoint",
]
