#!/bin/bash
# One GPU, one go: this project's GPU figures beside nanoGPT's own code on the same card, in one run
# (issue "GPU: right by default ..."). Run from the project's root with nanoGPT's anchors copied beside it:
#   cp -r ../shared/anchors .anchors && cp -r ../shared/tiktoken_cache ../shared/data .anchors/
#   bash benchmarks/gpu_round.sh [budget_s]      # logs in $OUT (default /tmp/gpu_round), packed in gpu.tgz
#   ONLY="char_profile ours_char_adamw loss" bash benchmarks/gpu_round.sh 540   # only the steps named
# Measured 2026-11-28 on an H100 (benchmarks/results/h100-2026-11-28): nanogpt_char ours_char_graph startup small
# small_eager small_profile loss, then auto_16gb auto_24gb float8 (no torchao there: one line), then loss_det; later
# that day (h100-2026-11-28b, three calls: 360, 242, 119 s): float8 ours_bpe nanogpt_bpe ours_bpe_compiled, then
# loss_det, batch auto at 16 and 24 GB with the probe's loss in chunks (auto_batch's former --probe-loss chunked,
# train.py's since), the char config ending at 1000 steps, small_same small_same_eager, then char_profile sdpa.
# Next, one call (~330 s, ~430 with the profile): GPT-2 124M, ours as shipped and at 32 x 16 beside nanoGPT's, its
# micro-step's kernels; the BPE config's 300 steps (profile_124m checked on the CPU only, at 1 layer of 64):
#   ONLY="nanogpt_124m ours_124m ours_124m_32 profile_124m ours_bpe auto_16gb auto_24gb" bash benchmarks/gpu_round.sh 540
# Then, in a second call, the levers left that do not change the math, each beside ours_124m_32 (the loss path under
# compile, Inductor's coordinate-descent tuning; its autotuned matmuls if the first two leave it 300 s):
#   ONLY="levers_124m ours_124m_32_cdt ours_124m_32_autotune" bash benchmarks/gpu_round.sh 420
# float8 needs torchao, which the GPU image lacks: carry its wheel (torchao 0.17.0, the first for torch 2.11+ by
# torchao's own table; .whl/ is git-ignored, and the round installs what it holds):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 -d .whl torchao==0.17.0      # then carry [".anchors", ".whl"]
# Steps run in order of importance; each has its own time cap, and a step that would not fit in what is
# left of the budget is skipped (said in summary.txt), so a cut run still reports the first ones.
# Lines of training output are stamped with the seconds since the command started (val loss against
# wall time, for the curves: python -m benchmarks.gpu_curves).
R=$(pwd); A=$R/.anchors; BUDGET=${1:-540}; T0=$(date +%s)
# an ONLY name that is no step would run nothing and say nothing, and cost a device call: refused first, before
# anything is written
STEPS=$(sed -n 's/^ *step \([a-z0-9_]*\) .*/\1/p' "${BASH_SOURCE[0]}" | tr '\n' ' ')
for WANT in $ONLY; do
  case " $STEPS" in *" $WANT "*) ;; *) echo "error: ONLY names '$WANT', which is no step of this round; the steps are: ${STEPS% }" >&2; exit 2;; esac
done
OUT=${OUT:-/tmp/gpu_round}; L=$OUT/logs; mkdir -p "$L"
export TIKTOKEN_CACHE_DIR=$A/tiktoken_cache SMALLGPT_SHAKESPEARE=$A/data/tinyshakespeare/input.txt
export WANDB_MODE=disabled PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 SMALLGPT_CACHE_DIR=/tmp/smallgpt-cache
PY=${PY:-python3}
S=$OUT/summary.txt
say() { echo "$*" | tee -a "$S"; }
if compgen -G "$R/.whl/*.whl" > /dev/null; then  # carried wheels (torchao for float8): installed beside the image's
  if $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$R"/.whl/*.whl; then
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}; say "== wheels: $(cd "$R/.whl" && echo *.whl)"
  else
    say "== wheels: pip install failed (the steps that need them will say so)"
  fi
fi
pack() { (cd "$OUT" && tar czf gpu.tgz logs 2>/dev/null); }
stamp() { $PY -u -c 'import sys, time
t = time.time()
for line in sys.stdin:
    sys.stdout.write(f"{time.time() - t:8.2f} {line}"); sys.stdout.flush()'; }
# step NAME CAP_S COMMAND...: run it (stamped, into logs/NAME.log) if CAP_S still fits the budget
step() {
  local name=$1 cap=$2; shift 2
  if [ -n "$ONLY" ] && [ "$name" != "$WANT" ]; then return; fi
  local left=$(( BUDGET - ($(date +%s) - T0) ))
  if [ "$left" -lt "$cap" ]; then say "== $name: skipped (cap ${cap}s, ${left}s left)"; return; fi
  local s=$(date +%s%N)
  # the command's own status (124: cut at its cap), not stamp's: before 2026-11-28 every step read rc=0
  ( timeout -k 5 "$cap" "$@" 2>&1 | stamp; exit "${PIPESTATUS[0]}" ) > "$L/$name.log"
  local rc=$?
  say "== $name: rc=$rc wall=$(( ($(date +%s%N) - s) / 1000000 )) ms: $*"
  pack
}
cd "$R"
say "######## $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader)"
$PY -c "import torch,sys;print('python',sys.version.split()[0],'torch',torch.__version__,'cudnn',torch.backends.cudnn.version())" | tee -a "$S"

all_steps() {  # in the file's order; ONLY="a b" runs those named, in ONLY's order
  # 1. decoding GPT-2 124M at batch 1: sample.py's default (the CUDA graph), the same static step uncaptured,
  #    eager, torch.compile (its first call = the compile's cost), nanoGPT's uncached loop, HF generate
  step decode 110 $PY bench.py --device cuda --only decode --compile --repeats 3 --json "$L/decode.json"
  # 2. the SDPA kernels at the attention shapes of the runs below (what the run plan times at start-up)
  step sdpa 30 $PY -c "
import torch
from runtime.attention import fastest_kernel
for b, h, t in ((16, 12, 1024), (64, 12, 1024), (64, 6, 256)):
    print(b, h, t, fastest_kernel(torch.device('cuda'), batch=b, n_head=h, seq=t, head_dim=64, dtype=torch.bfloat16))"
  # 3. GPT-2 124M: nanoGPT's own train.py, 16 x 1024 a micro-step, bias as ours (True), compiled, bf16
  step nanogpt_124m 80 bash -c "cd $A/nanogpt && $PY train.py config/train_gpt2.py --dataset=shakespeare --batch_size=16 \
    --gradient_accumulation_steps=1 --max_iters=40 --log_interval=5 --eval_interval=100000 --eval_iters=1 \
    --wandb_log=False --bias=True --out_dir=/tmp/gr_ng"
  # 4. ours: train.py --config gpt2_124m as shipped (batch_size auto, 512 sequences a step), 6 steps
  step ours_124m 130 $PY train.py --config gpt2_124m --data.dataset=shakespeare --data.val_fraction=0.1 --data.num_proc=0 \
    --train.max_iters=6 --train.eval_iters=1 --train.log_interval=1 --train.warmup_iters=2 --train.eval_interval=1000 \
    --train.checkpoint_interval=1000 --train.out_dir=/tmp/gr_124m
  # 5. characters: nanoGPT's train_shakespeare_char ("baby GPT"), then ours shakespeare_char_gpu.yaml
  step nanogpt_char 110 bash -c "cd $A/nanogpt && $PY train.py config/train_shakespeare_char.py --max_iters=2500 \
    --lr_decay_iters=2500 --wandb_log=False --always_save_checkpoint=False --out_dir=/tmp/gr_ngc"
  step ours_char 140 $PY train.py --config shakespeare_char_gpu --train.compile=true --train.out_dir=/tmp/gr_char
  # (2026-11-27: compile and start-up took 49 s of the 83 s to val 1.47.) Without compile the step is replayed as
  # one CUDA graph (training/graphs/step.py: no compile, a capture of ~1 s): the same run to val 1.47 that way
  # (2026-11-28: val 1.4680 at step 750, 33.5 s; nanoGPT's best 1.4727 at 96.4 s; shipped since). Its val was lowest
  # at steps 750-1000 of 2000 and rose after: the config ends at 1000 since (1.4673 at step 625, 24.1 s; h100-2026-11-28b)
  step ours_char_graph 100 $PY train.py --config shakespeare_char_gpu --train.compile=false --train.out_dir=/tmp/gr_char_graph
  # where the char run's start-up goes (2026-11-27: 12 s before its first step, 0.8 s of it on a CPU): one step, profiled
  step startup 60 bash -c "$PY -m cProfile -o /tmp/gr_startup.prof train.py --config shakespeare_char_gpu --train.compile=false \
    --train.max_iters=1 --train.eval_iters=1 --train.eval_full=false --train.out_dir=/tmp/gr_startup && \
    $PY -c \"import pstats; pstats.Stats('/tmp/gr_startup.prof').sort_stats('cumulative').print_stats(45)\""
  # what a char step spends its GPU time on (2026-11-27: ~2x nanoGPT's step): the top kernels, eager, graphed and
  # compiled, with Muon as shipped and with AdamW; then the whole run with AdamW, to val 1.47 against the clock
  step char_profile 150 bash -c "$PY -m benchmarks.gpu_step_profile --config shakespeare_char_gpu --steps 30 --top 15 && \
    $PY -m benchmarks.gpu_step_profile --config shakespeare_char_gpu --steps 30 --top 15 --set train.optimizer=adamw"
  step ours_char_adamw 100 $PY train.py --config shakespeare_char_gpu --train.optimizer=adamw --train.lr=1e-3 \
    --train.out_dir=/tmp/gr_char_adamw
  # 6. small.yaml as a newcomer runs it (its step replayed as one CUDA graph, the default since 2026-11-27's
  #    third session), then what bounds its step: eager, graphed, compiled (2026-11-27, eager: 13.9 ms a step,
  #    GPU busy 2.1 ms); the graphed step's first losses against the eager step's
  step small 80 $PY train.py --config small.yaml --train.out_dir=/tmp/gr_small
  step small_eager 80 $PY train.py --config small.yaml --train.cuda_graph=false --train.out_dir=/tmp/gr_small_eager
  step small_profile 100 $PY -m benchmarks.gpu_step_profile
  # the graphed and the eager run of small.yaml parted by iter 10 (10.6636 against 10.6665, 2026-11-28) while the
  # profile's 24 steps agree bit for bit: the same pair without the time budget's timed steps and without dropout
  step small_same 60 $PY train.py --config small.yaml --train.time_budget=0 --model.dropout=0 --train.log_interval=1 \
    --train.max_iters=300 --train.out_dir=/tmp/gr_small_same
  step small_same_eager 60 $PY train.py --config small.yaml --train.time_budget=0 --model.dropout=0 --train.log_interval=1 \
    --train.max_iters=300 --train.cuda_graph=false --train.out_dir=/tmp/gr_small_same_eager
  step sample 30 $PY sample.py --checkpoint /tmp/gr_small --seed 1 --max-new-tokens 200
  # 7. the same-loss check, 200 steps under nanoGPT's schedule, beside three re-runs of the baseline (its own
  #    spread) and the first step where each run parts from the baseline bit for bit; then all of it under
  #    deterministic algorithms, where ours should equal the baseline if nothing but the GPU's noise differs
  #    (2026-11-27: ours -0.0203, one re-run 0.0033; on a CPU ours equals the baseline bit for bit)
  step loss 230 $PY bench.py --device cuda --only loss --loss-steps 200 --loss-noise-runs 3 --json "$L/loss.json"
  step loss_det 230 $PY bench.py --device cuda --only loss --loss-steps 200 --loss-noise-runs 1 --loss-deterministic \
    --json "$L/loss-det.json"
  # 8. GPT-2 BPE on tiny shakespeare: ours shakespeare_gpu.yaml as shipped (its step a CUDA graph), then compiled
  step ours_bpe 80 $PY train.py --config shakespeare_gpu --train.out_dir=/tmp/gr_bpe
  # nanoGPT ships no GPT-2 BPE config for training on tiny shakespeare from scratch: its baby-GPT recipe
  # (train_shakespeare_char.py: 6L/384, block 256, batch 64, dropout 0.2, compiled) on its prepared BPE data, its
  # schedule ended at 1000 steps and evaluated as often as ours (every 100 steps, 20 batches; its batches random
  # windows, ours fixed ones), for the BPE curves' picture
  step nanogpt_bpe 120 bash -c "cd $A/nanogpt && $PY train.py config/train_shakespeare_char.py --dataset=shakespeare \
    --max_iters=1000 --lr_decay_iters=1000 --eval_interval=100 --eval_iters=20 --wandb_log=False \
    --always_save_checkpoint=False --out_dir=/tmp/gr_ngb"
  step ours_bpe_compiled 130 $PY train.py --config shakespeare_gpu --train.compile=true --train.out_dir=/tmp/gr_bpe_c
  # 9. levers one at a time: ours at nanoGPT's fixed micro-batch (16 x 32), then batch auto on 16 and 24 GB cards
  step ours_124m_16 110 $PY train.py --config gpt2_124m --data.dataset=shakespeare --data.val_fraction=0.1 --data.num_proc=0 \
    --train.batch_size=16 --train.grad_accum_steps=32 --train.global_batch_size=0 --train.max_iters=4 --train.eval_iters=1 \
    --train.log_interval=1 --train.warmup_iters=2 --train.eval_interval=1000 --train.checkpoint_interval=1000 --train.out_dir=/tmp/gr_124m16
  # the largest micro-batch that fits is not always the fastest: on a 24 GB cap 32 x 1024 ran 490k tok/s (2026-11-28)
  # where 64 x 1024, auto's choice on 80 GB on 2026-11-27, ran 463-480k (auto may choose 128 since its probe takes the
  # loss in chunks): 32 x 16 beside ours_124m (auto) and nanoGPT's run
  step ours_124m_32 110 $PY train.py --config gpt2_124m --data.dataset=shakespeare --data.val_fraction=0.1 --data.num_proc=0 \
    --train.batch_size=32 --train.grad_accum_steps=16 --train.global_batch_size=0 --train.max_iters=6 --train.eval_iters=1 \
    --train.log_interval=1 --train.warmup_iters=2 --train.eval_interval=1000 --train.checkpoint_interval=1000 --train.out_dir=/tmp/gr_124m32
  # where a GPT-2 124M micro-step's GPU time goes (the issue's levers: the SDPA kernel by its name, what the compiled
  # step fuses, the optimizer, the gaps between kernels): 32 x 1024, eager beside compiled, the top 25 kernels
  step profile_124m 160 $PY -m benchmarks.gpu_step_profile --config gpt2_124m --steps 10 --top 25 --modes eager,compiled \
    --set train.batch_size=32 --set train.grad_accum_steps=1 --set train.global_batch_size=0
  # the levers left that do not change the math, each beside ours_124m_32 (32 x 16, as shipped otherwise): the loss
  # path under compile (the full logits, which compile fuses, against the fused loss in chunks, timed interleaved
  # in one process with the baseline), then Inductor's own tuning, set from outside by torch's environment
  # variables: coordinate-descent tuning of its generated kernels, and autotuned matmuls (longer compiles)
  step levers_124m 200 $PY bench.py --device cuda --only train --vocabs 50304 --batch-sizes 32 --loss-paths --warmup 3 \
    --iters 15 --json "$L/levers-124m.json"
  step ours_124m_32_cdt 170 env TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1 $PY train.py --config gpt2_124m \
    --data.dataset=shakespeare --data.val_fraction=0.1 --data.num_proc=0 --train.batch_size=32 --train.grad_accum_steps=16 \
    --train.global_batch_size=0 --train.max_iters=6 --train.eval_iters=1 --train.log_interval=1 --train.warmup_iters=2 \
    --train.eval_interval=1000 --train.checkpoint_interval=1000 --train.out_dir=/tmp/gr_124m32cdt
  step ours_124m_32_autotune 300 env TORCHINDUCTOR_MAX_AUTOTUNE_GEMM=1 $PY train.py --config gpt2_124m \
    --data.dataset=shakespeare --data.val_fraction=0.1 --data.num_proc=0 --train.batch_size=32 --train.grad_accum_steps=16 \
    --train.global_batch_size=0 --train.max_iters=6 --train.eval_iters=1 --train.log_interval=1 --train.warmup_iters=2 \
    --train.eval_interval=1000 --train.checkpoint_interval=1000 --train.out_dir=/tmp/gr_124m32at
  step auto_16gb 100 $PY -m benchmarks.auto_batch --memory-gb 16 --json "$L/auto-16gb.json"
  step auto_24gb 100 $PY -m benchmarks.auto_batch --memory-gb 24 --json "$L/auto-24gb.json"
  step float8 260 $PY bench.py --device cuda --only train --vocabs 50304 --batch-sizes 16 --float8 tensorwise,rowwise --warmup 3 --iters 15 --json "$L/float8.json"
}
if [ -n "$ONLY" ]; then for WANT in $ONLY; do all_steps; done; else all_steps; fi
say "######## done after $(( $(date +%s) - T0 )) s"
pack
