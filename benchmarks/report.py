"""The report bench.py prints: a header on the machine and settings, one table, and the text around it."""
from __future__ import annotations

from .fsdp import format_fsdp
from .serve import format_serve
from .profile import format_profile


def _fmt(v, kind: str) -> str:
    if v is None:
        return "-"
    if kind == "time":
        return f"{v:.3g}" if v < 10 else f"{v:.1f}" if v < 1000 else f"{v:.0f}"
    if kind == "rate":
        return f"{v:.1f}" if v < 100 else f"{v:,.0f}"
    if kind == "mb":
        return f"{v:,.0f}"
    if kind == "mfu":
        return f"{v * 100:.1f}%"
    return str(v)


HEAD = ["section", "row", "prec", "batch", "unit", "ours", "base", "tok/s ours", "base", "MFU ours", "base",
        "mem MB ours", "base", "base/ours"]


def format_table(rows: list[dict]) -> str:
    body = [[r["section"], r["name"], r["precision"], str(r.get("batch", "")), r["unit"], _fmt(r["ours"], "time"),
             _fmt(r["base"], "time"), _fmt(r.get("ours_tok_s"), "rate"), _fmt(r.get("base_tok_s"), "rate"),
             _fmt(r.get("ours_mfu"), "mfu"), _fmt(r.get("base_mfu"), "mfu"), _fmt(r.get("ours_mem_mb"), "mb"),
             _fmt(r.get("base_mem_mb"), "mb"), f"{r['speedup']:.2f}x"] for r in rows]
    widths = [max(len(x[i]) for x in [HEAD] + body) for i in range(len(HEAD))]

    def line(cells):
        return "  ".join(c.ljust(w) if i < 5 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
    out = [line(HEAD), line(["-" * w for w in widths])]
    prev = None
    for r, cells in zip(rows, body):
        if prev is not None and r["section"] != prev:
            out.append("")
        prev = r["section"]
        out.append(line(cells))
    return "\n".join(out)


def _pct(x: float | None) -> str:
    return "?" if x is None else f"{x:.0%}"


def _yes(flag: bool, known: bool) -> str:
    return "?" if not known else "yes" if flag else "no"


def print_report(report: dict, print=print) -> None:
    m, s = report["machine"], report["settings"]
    print(f"machine: {m['cpu']}, {m['cores']} cores ({m['usable_cores']} usable), torch {m['torch']}, "
          f"{m['threads']} thread(s), {m['cpu_capability']}, AMX {_yes(m['amx'], m['flags_known'])}, "
          f"avx512_bf16 {_yes(m['avx512_bf16'], m['flags_known'])}"
          + (f"; GPU {m['gpu']} (capability {m['capability']}, {m['sms']} SMs, {m['memory_gb']:.0f} GiB, "
             f"CUDA {m['cuda']})" if "gpu" in m else ""))
    print("peaks (MFU is against these): " + ", ".join(f"{k} {v / 1e12:.3g} TFLOP/s" if v and v > 1e12 else
                                                         f"{k} {v / 1e9:.0f} GFLOP/s" if v else f"{k} unknown"
                                                         for k, v in report["peak_flops"].items())
          + f" ({report['peak_source']})")
    for label, note in report["dtype_auto"].items():
        print(f"{label}: {note}")
    print(f"settings: {'QUICK (figures meaningless); ' if s['quick'] else ''}training {s['warmup']} warm-up + "
          f"{s['iters']} timed steps per row in {s['rounds']} interleaved rounds, medians; decode/prepare "
          f"{s['repeats']} call(s) per row; base = the plain baseline measured in the same run\n")
    if report["rows"]:
        print(format_table(report["rows"]))
    for r in report["rows"]:
        if r.get("compiled") and r.get("ours_first_s"):
            print(f"\n{r['section']} (batch {r.get('batch')}): the first step of '{r['name']}' took {r['ours_first_s']:.1f} s "
                  "(compiling)")
    if "largest_batch" in report:
        lb = report["largest_batch"]
        print(f"\nlargest batch: {lb['batch']} (peak memory at batch {lb['from_batch']} extrapolated to "
              f"{lb['headroom']:.0%} of the GPU's memory, multiple of 8)")
    tg = report.get("targets", {})
    if "bpe_fp32" in tg:
        b = tg["bpe_fp32"]
        print(f"\nBPE fp32 step: {_fmt(b['mfu'], 'mfu')} of the fp32 matmul probe's peak (target >= "
              f"{b['mfu_target']:.0%}), {b['speedup']:.2f}x nanoGPT's loop (target >= {b['speedup_target']:.1f}x)")
    own = report.get("nanogpt_own")
    if own:
        line = (f"\nnanoGPT's own train.py ({own['dir']}, the median of iterations {own['first_iter']}-"
                f"{own['first_iter'] + own['iters'] - 1}): {own['median_ms']:.1f} ms a step")
        if "bpe_fp32" in tg:
            line += f"; ours fp32 {tg['bpe_fp32']['speedup_own']:.2f}x (target >= {tg['bpe_fp32']['speedup_target']:.1f}x)"
        if "bpe_auto" in tg and tg["bpe_auto"]["precision"] != "float32":
            line += f", ours {tg['bpe_auto']['precision']} (auto) {tg['bpe_auto']['speedup_own']:.2f}x"
        print(line)
        hf = tg.get("bpe_fp32", {}).get("head_floor")
        if hf:
            prods = own["head_floor"]["products"]
            print(f"the floor under the fp32 step: its LM head's three products alone (each by the fastest of "
                  f"{', '.join(own['head_floor']['libraries'])}, best of "
                  f"{own['head_floor']['calls']}): " + ", ".join(f"{k} {p['ms']:.1f} ms ({p['gflops']:.0f} GFLOP/s)"
                                                                for k, p in prods.items())
                  + f" = {hf['head_ms']:.1f} ms. 2.0x needs <= {hf['needed_ms']:.1f} ms a step, which leaves "
                  f"{hf['left_ms']:.1f} ms for all the rest (blocks, softmax, AdamW, clipping, Python); the rest "
                  f"takes {hf['rest_ms']:.1f} ms in ours")
    if "muon" in report:
        mu = report["muon"]
        print(f"\nMuon step / AdamW step ({mu['config']}, {mu['dtype']}, Newton-Schulz in {mu['ns_dtype']}): "
              f"{mu['muon_ms']:.1f} / {mu['adamw_ms']:.1f} ms = {mu['ratio']:.2f}x (target <= {mu['target']}x "
              f"{'with native bf16' if mu['native_bf16'] else 'without native bf16'})")
    d = report.get("decode")
    if d and "fp32_tokens_equal_hf" in d:
        print(f"\ndecode check: ours fp32 greedy tokens {'==' if d['fp32_tokens_equal_hf'] else '!='} HF generate's")
    lc = report.get("loss_check")
    if lc:
        print(f"\nsame loss after {lc['steps']} steps ({lc['data']}, same init and batches; val = {lc['eval_batches']} "
              f"fixed held-out batches, fp32): baseline {lc['base_val_loss']:.4f}, ours ({lc['ours_dtype']}) "
              f"{lc['ours_val_loss']:.4f}, difference {lc['diff_val_loss']:+.4f}"
              + (f" (the baseline run again: {', '.join(f'{d:+.4f}' for d in lc['noise_val_diffs'])})"
                 if lc.get("noise_val_diffs") else "")
              + (f"; the first step whose train loss differs from the baseline's, bit for bit: "
                 + ", ".join(f"{name} {'none' if i is None else i}" for name, i in lc["first_differing_step"].items())
                 + (" (deterministic algorithms)" if lc.get("deterministic") else "")
                 if "first_differing_step" in lc else "")
              + f"; largest difference of the per-step train losses over the first {lc['early_steps']} steps: "
              f"{lc['early_max_diff']:.4f}; verdict on the {lc['verdict_on']}: "
              f"{'agree' if lc['agree'] else 'DIFFER'} (tolerance {lc['tolerance']}; lr {lc.get('schedule', 'constant')}); mean train loss of the last "
              f"{min(20, lc['steps'])} steps: {lc['base_train_loss_last']:.4f} vs {lc['ours_train_loss_last']:.4f} "
              f"(start {lc['initial_train_loss']:.3f})")
    budget = report.get("budget")
    if budget:
        nano = budget.get("nanogpt")
        print(f"\nquality in a time budget: W = {budget['budget_s']:.0f} s"
              + (f", the wall time of nanoGPT's CPU recipe for shakespeare_char here (val loss {nano['val_loss']:.3f}, "
                 f"{nano['val_bpb']:.3f} bits/byte after 2000 steps; whole val split {nano['val_loss_full']:.3f})"
                 if nano else " (given)"))
        print("val loss: the eval's estimate (20 random batches); whole val: every val token once, where a run "
              "measured it (train.eval_full)")
        head = ["config", "budget", "seconds", "iter", "whole val", "val loss", "bits/byte", "whole run: s", "final val"]
        body = [[r["config"], r["budget"], f"{r['budget_s']:.0f}", str(r["iter"] if r["iter"] is not None else "-"),
                 f"{r['val_loss_full']:.3f}" if r.get("val_loss_full") is not None else "-",
                 f"{r['val_loss']:.3f}" if r["val_loss"] is not None else "-",
                 f"{r['val_bpb']:.3f}" if r["val_bpb"] is not None else "-", f"{r['run_s']:.0f}", f"{r['final_val']:.3f}"]
                for r in budget["rows"]]
        widths = [max(len(x[i]) for x in [head] + body) for i in range(len(head))]
        for cells in [head, ["-" * w for w in widths]] + body:
            print("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))))
    if report.get("fsdp"):
        print("\n" + format_fsdp(report["fsdp"]))
    if report.get("serve"):
        print("\n" + format_serve(report["serve"]))
    for label, prof in report.get("profile", {}).items():
        print("\nwhere the time goes, " + format_profile(label, prof["dtype"], prof))
    c = report.get("corpus")
    if c:
        print(f"\ncorpus {c['corpus_mb']:.0f} MB of jsonl ({c['tokens']:,} tokens), {c['procs']} processes and {c['shard_tokens']:,}-token shards each: ours "
              f"{c['ours_mb_s']:.1f} MB/s at {c['ours_peak_rss_mb']:.0f} MB peak memory (PSS, all processes), Pool+tiktoken "
              f"{c['base_mb_s']:.1f} MB/s at {c['base_peak_rss_mb']:.0f} MB; "
              + (f"killed at {c['killed_at_s']:.1f} s with {c['killed_at_fraction']:.0%} of the tokens recorded, the "
                 if c["was_killed"] else "NOT killed (it finished first), the ")
              + f"resume took {c['resume_s']:.1f} s = {c['resume_fraction']:.0%} of an uninterrupted run "
              f"(result {'byte-equal' if c['resumed_equals_uninterrupted'] else 'DIFFERENT'})")
    rss = report.get("prepare_rss")
    if rss:
        print(f"\nprepare {rss['size_mb']} MB synthetic source: peak RSS {rss['peak_rss_mb']:.0f} MB, "
              f"{rss['seconds']:.0f} s ({rss['size_mb'] / rss['seconds']:.1f} MB/s)")
    busy = report["busy"]
    known = [b for b in busy.values() if b is not None]
    if known:
        print(f"\nother processes kept the cores {_pct(busy['before'])} busy just before, {_pct(busy['during_others'])} "
              f"during, {_pct(busy['after'])} just after the run"
              + (": the machine was busy, so absolute figures are low (baseline and ours alike)"
                 if max(known) > 0.25 else ": the machine was quiet"))
    for note in report["notes"]:
        print(f"note: {note}")
    print(f"peak RSS {report['peak_rss_mb']:.0f} MB; wall time {report['wall_s']:.0f} s")
