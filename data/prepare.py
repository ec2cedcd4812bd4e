"""Prepare a dataset: python -m data.prepare --dataset shakespeare --tokenizer gpt2

Prints the prepared directory on stdout. Bad input ends with a one-line `error: ...` and status 2.
"""
from __future__ import annotations

import errors

if __name__ == "__main__":  # a command: Ctrl-C while the imports below run is one line (errors.quiet_interrupts)
    errors.quiet_interrupts()

from dataclasses import fields

from errors import ArgumentParser, run_cli
from fileio import optional_path_arg, path_arg

from .build import prepare_data
from .config import FORMATS, DataConfig
from .shards import fixed_mmap_threshold


def build_parser() -> ArgumentParser:
    defaults = DataConfig()
    p = ArgumentParser(prog="python -m data.prepare", description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default=defaults.dataset, type=path_arg, help="'shakespeare', a file, folder or glob of .txt, .jsonl, "
                   ".json or .parquet (plain, .gz or .zst), a save_to_disk folder, or 'hf:<name>'")
    p.add_argument("--tokenizer", default=defaults.tokenizer, help="'char', a tiktoken encoding name, or 'bpe:<vocab_size>'")
    p.add_argument("--val-fraction", type=float, default=defaults.val_fraction)
    p.add_argument("--val-dataset", default=defaults.val_dataset, type=optional_path_arg, help="a separate val source (then all of --dataset is train)")
    p.add_argument("--skip-bad-rows", action="store_true", help="skip (and count) bad rows instead of stopping")
    p.add_argument("--shard-tokens", type=int, default=defaults.shard_tokens)
    p.add_argument("--tokenizer-sample-mb", type=int, default=defaults.tokenizer_sample_mb)
    p.add_argument("--root", default=defaults.root, type=path_arg, help="where prepared dirs go")
    p.add_argument("--local-path", default=defaults.local_path, type=optional_path_arg, help="a local copy of tiny shakespeare")
    p.add_argument("--hf-subset", default=defaults.hf_subset)
    p.add_argument("--hf-split", default=defaults.hf_split)
    p.add_argument("--text-field", default=defaults.text_field)
    p.add_argument("--format", default=defaults.format, choices=FORMATS,
                   help="'text' (documents) or 'chat' (a conversation per row: {\"messages\": [{\"role\", \"content\"}]})")
    p.add_argument("--messages-field", default=defaults.messages_field, help="--format chat: the field holding the messages")
    p.add_argument("--streaming", action="store_true", help="stream the HF dataset instead of downloading it")
    p.add_argument("--num-proc", type=int, default=defaults.num_proc, help="tokenizer processes (0 = one per core)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar or status messages")
    return p


def main(argv: list[str] | None = None) -> int:
    args = vars(build_parser().parse_args(argv))
    progress = not args.pop("no_progress")
    cfg = DataConfig(**{f.name: args[f.name] for f in fields(DataConfig)})
    fixed_mmap_threshold()  # this process is the prepare's own
    print(prepare_data(cfg, progress=progress))
    return 0


if __name__ == "__main__":
    errors.start_up_done()  # the imports are done: Ctrl-C is a KeyboardInterrupt again (run_cli says it)
    run_cli(main, oom_fix="lower --num-proc or --shard-tokens")
