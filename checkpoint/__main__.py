"""Checkpoint tools.

    python -m checkpoint consolidate <out_dir or ckpt.dcp> [--out PATH]

consolidate: a sharded checkpoint (train.parallel=fsdp: ckpt.dcp/, written by any number of ranks) as
one file, read in this process alone (no process group): the whole weights and every entry inference
and the export read, plus the run's config and counters. The optimizer state stays in the shards
(resume the run from its out_dir, on any number of ranks). Default output: <out_dir>/consolidated.pt,
beside the run's own checkpoints (not over them: a resume keeps reading ckpt.dcp/).
"""
from __future__ import annotations

import errors

if __name__ == "__main__":  # a command: Ctrl-C while the imports below run is one line (errors.quiet_interrupts)
    errors.quiet_interrupts()

import sys
import warnings
from pathlib import Path

from errors import ArgumentParser, UserError, run_cli
from fileio import check_output_not_input, check_path_value, output_target, file_arg, path_arg
from ownership import OUT_DIR, check_output, kind_of

from .format import CKPT_NAME, FORMAT, SCHEMA, VERSION, load_checkpoint, resolve_checkpoint_path, save_checkpoint

CONSOLIDATED_NAME = "consolidated.pt"
# what inference reads (the schema's inference entries: a chat model's template among them, which a list written
# here by hand left out, so a consolidated chat model was "not a chat model"), and the run's record the export's
# card reads (config, counters, plan); not the optimizer, scaler, loader or RNG: a consolidated file is not resumed
KEPT = (*(name for name, entry in SCHEMA.items() if entry.inference), "config", "train", "plan")


def consolidate(source: str | Path, out: str | Path | None = None) -> Path:
    """Write the single-file checkpoint of the sharded checkpoint `source` (an out_dir or a ckpt.dcp/);
    returns its path."""
    path = resolve_checkpoint_path(check_path_value(source, "the checkpoint"))
    if not path.is_dir():  # resolved: a folder is a sharded checkpoint, complete or not (load_checkpoint names a gap)
        raise UserError(f"{path} is already a single-file checkpoint; consolidate reads a sharded one (ckpt.dcp/, "
                        "written with train.parallel=fsdp)")
    target = check_path_value(out, "--out") if out is not None else path.parent / CONSOLIDATED_NAME
    output_target(target, "--out")  # a directory, a socket, a symlink loop: refused before any reading
    check_output_not_input(target, [(f"the checkpoint {path}", path)], "--out")  # by identity: links too
    if target.suffix == ".dcp":  # save_checkpoint would write a sharded folder: consolidate writes one file
        raise UserError(f"--out {target}: a .dcp name is a sharded checkpoint's folder; consolidate writes one file, "
                        f"e.g. --out {target.with_suffix('.pt')}")
    if target.resolve() == (path.parent / CKPT_NAME).resolve():
        raise UserError(f"{target} is where a single-file run keeps its latest checkpoint; write elsewhere, e.g. "
                        f"--out {path.parent / CONSOLIDATED_NAME}")
    # in no managed folder but the run's own out_dir (the default), and never in the checkpoint it reads
    check_output(target, "--out", reading=(path,), home=path.parent if kind_of(path.parent) == OUT_DIR else None)
    with warnings.catch_warnings():  # DCP warns that it loads in one process: that is the point
        warnings.simplefilter("ignore")
        ckpt = load_checkpoint(path, needed=("model", "model_config", "tokenizer"))
    try:
        save_checkpoint(target, {k: ckpt[k] for k in KEPT if k in ckpt}, follow=True)
    except OSError as e:
        raise UserError(f"cannot write {target} ({e.strerror or e}); choose another --out") from None
    return target


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m checkpoint", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("consolidate", help="write a sharded checkpoint (ckpt.dcp/) as one file")
    c.add_argument("source", type=path_arg, help="a training out_dir, or a ckpt.dcp/ (best.dcp/) directory")
    c.add_argument("--out", default=None, type=file_arg,
                   help=f"the file to write (default: <out_dir>/{CONSOLIDATED_NAME})")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    target = consolidate(args.source, args.out)
    print(f"wrote {target} ({FORMAT} version {VERSION})")
    return 0


if __name__ == "__main__":
    errors.start_up_done()  # the imports are done: Ctrl-C is a KeyboardInterrupt again (run_cli says it)
    run_cli(main)
