"""Sample text from a trained checkpoint (or an HF GPT-2), with the KV cache.

    python sample.py                                   # the run under out/ trained last, prompt "\\n"
    python sample.py --checkpoint out/small --prompt "ROMEO:" --num-samples 3 --temperature 0.8
    python sample.py --checkpoint gpt2 --prompt-file prompt.txt --top-p 0.9
    echo "Once upon a time" | python sample.py -       # the prompt from stdin (also --prompt-file -)

Model config, tokenizer and vocabulary come from the checkpoint. One sample streams to stdout as it is
generated; several samples run as one batch and print whole, each under a `---- sample i/N ----` line.
Generation itself lives in model/generate.py (prefill + one cached token per step, crop rule there).
This script only starts the command: its options and main are inference/sample_cli.py, the prompts
inference/prompts.py.

Prompts:
- no prompt option: the prompt is "\\n", as in nanoGPT (or end-of-text if the vocabulary has no newline);
- an empty prompt (--prompt "", an empty file, empty stdin): generation starts from the end-of-text
  token, and a note on stderr says so;
- --prompt / --prompt-file may be repeated: each prompt gets --num-samples samples, all in one batch
  (prompts of different lengths are left-padded);
- a prompt longer than block_size keeps its last block_size tokens as context.

Seeds: --seed S gives the same text for the same settings, device and dtype; without it a fresh seed
is drawn and shown on stderr (with the checkpoint, device and dtype) so a run can be repeated.
--dtype auto: on a CPU with native bf16 (AMX, AVX512-BF16) the faster of fp32 and prepacked bf16 for
this model, timed on a few decoding steps (runtime/precision.py's inference_dtype); fp32 on other CPUs,
untimed (bf16 would be emulated); on GPUs bf16 where native, else fp16.
--stop-at-eot (default): a sample ends at the end-of-text token, which is not printed.
--min-p, --repetition-penalty: see model/generate.py's logits_to_probs (the order of every filter).
--no-stream prints a single sample whole at the end; --out FILE writes the samples there (atomically)
instead of stdout; it may not be a file sample.py reads (the checkpoint's files, a prompt file, a
redirected stdin) nor lie in a sharded checkpoint. A symlink's target is written, a device (/dev/null)
or a FIFO being read is written straight into; a FIFO nobody reads, a socket or a directory is refused
(fileio.output_target). With stdout closed (`>&-`) --out is needed. Ctrl-C keeps what was generated: it is
printed (or written to --out), then exit 130.

Every bad input (checkpoint, prompt, option) is one `error: ...` line on stderr and exit status 2.
"""
from __future__ import annotations

import errors

if __name__ == "__main__":  # before the heavy imports: Ctrl-C during start-up is one line
    errors.quiet_interrupts()

from inference.sample_cli import main  # noqa: E402

if __name__ == "__main__":
    errors.start_up_done()
    errors.run_cli(main, oom_fix="lower --num-samples or --max-new-tokens, or sample from a smaller model")
