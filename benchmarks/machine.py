"""What the machine is (CPU model and flags, GPU, torch), and how busy other processes kept it."""
from __future__ import annotations

import os
import platform
import resource
import time

import torch


def cpu_info() -> dict:
    """CPU model, core counts, torch version and threads, and the CPU's AMX / AVX512-BF16 flags."""
    model, flags = None, set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model is None:
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {
        "cpu": model or platform.processor() or platform.machine(), "cores": os.cpu_count(), "usable_cores": usable,
        "torch": torch.__version__, "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "amx": any(fl.startswith("amx") for fl in flags), "avx512_bf16": "avx512_bf16" in flags,
        "flags_known": bool(flags),
    }


def gpu_info(device: torch.device) -> dict:
    props = torch.cuda.get_device_properties(device)
    return {"gpu": props.name, "capability": f"{props.major}.{props.minor}", "sms": props.multi_processor_count,
            "memory_gb": props.total_memory / 2**30, "cuda": torch.version.cuda}


def cpu_busy_fraction(seconds: float = 1.0) -> float | None:
    """How busy the cores were over `seconds` (from /proc/stat), measured while this process sleeps, so
    it is other processes' load. None where /proc/stat does not exist."""
    def read():
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
        return sum(fields), fields[3] + fields[4]  # total, idle + iowait

    try:
        t0, i0 = read()
        time.sleep(seconds)
        t1, i1 = read()
    except OSError:
        return None
    return 1.0 - (i1 - i0) / max(1, t1 - t0)


class CoreUse:
    """How much CPU other processes used while this one ran: /proc/stat's busy time of all cores minus
    this process's own CPU time, over the cores' total time."""

    def __init__(self):
        self.start = self._read()

    @staticmethod
    def _read():
        try:
            with open("/proc/stat") as f:
                fields = [int(v) for v in f.readline().split()[1:]]
        except OSError:
            return None
        hz = os.sysconf("SC_CLK_TCK")
        own = resource.getrusage(resource.RUSAGE_SELF)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        own_s = own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
        total = sum(fields[:8]) / hz  # user nice system idle iowait irq softirq steal
        idle = (fields[3] + fields[4]) / hz
        return total, idle, own_s

    def others_fraction(self) -> float | None:
        end = self._read()
        if self.start is None or end is None:
            return None
        total, idle, own = (e - s for e, s in zip(end, self.start))
        return max(0.0, min(1.0, (total - idle - own) / max(total, 1e-9)))
