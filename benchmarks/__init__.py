"""The benchmark behind `python bench.py`: each module measures one thing through the project's real
code paths (the training step train.py runs, the sampler sample.py runs, the data preparation
train.py runs) against a plain baseline measured in the same process; report.py prints the table.

    machine.py   what the machine is and how busy it was
    timing.py    interleaved timing of variants, peak memory
    baseline.py  the plain loops we compare against (nanoGPT's training step, prepare and sampling)
    train.py     training-step rows, and the same-loss check
    decode.py    decoding rows
    prepare.py   data-preparation rows
    budget.py    quality in nanoGPT's time (--only budget)
    profile.py   where a CPU step's time goes (--only profile)
    fsdp.py      DDP against FSDP: 2 gloo ranks, peak RSS and step time per rank (--only fsdp)
    muon.py      a Muon step against an AdamW step (--only muon)
    serve.py     python serve.py under 1 and 8 streaming clients: first token, tokens per second (--only serve)
    nanogpt_own.py  nanoGPT's own train.py on the BPE CPU recipe, and the floor under our step (--nanogpt-dir)
    auto_batch.py   train.batch_size auto on an emulated smaller GPU (CUDA)
    pool_prepare.py the baseline of the corpus row (--only corpus)
    report.py    the table and the text around it
    cli.py       bench.py's options, checked before anything is measured, and its main
    suite.py     the run: every section asked for, the report printed and written to --json
"""
