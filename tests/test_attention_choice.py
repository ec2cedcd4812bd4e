"""The SDPA kernel a GPU trains with (runtime/attention.py) is measured once per GPU, software and shape and
then read from the choices cache, as the CPU's dtype is. The reference: a counter of the probes that ran (the
probe itself needs a GPU; here it is replaced by one that says which kernel won)."""
from __future__ import annotations

import json

import pytest
import torch

from runtime import attention, choices

CUDA = torch.device("cuda")  # constructing a device touches no GPU


@pytest.fixture
def probe(monkeypatch):
    calls = []

    def measure(device, shape, dtype):
        calls.append((shape, dtype))
        return "cudnn", f"attention: the cudnn kernel first (probe {len(calls)})"

    monkeypatch.setattr(attention, "_measure", measure)
    monkeypatch.setattr(attention, "gpu_key", lambda device: "NVIDIA H100 80GB HBM3 | torch x | cudnn 91000")
    return calls


def choose(**shape):
    return attention.fastest_kernel(CUDA, **{"batch": 64, "n_head": 6, "seq": 256, "head_dim": 64,
                                             "dtype": torch.bfloat16, **shape})


def test_off_a_gpu_or_in_fp32_nothing_is_measured_or_kept(probe):
    assert attention.fastest_kernel(torch.device("cpu"), batch=4, n_head=2, seq=8, head_dim=4,
                                    dtype=torch.bfloat16) == (attention.DEFAULT, "")
    assert choose(dtype=torch.float32) == (attention.DEFAULT, "")
    assert probe == [] and not choices.cache_path().exists()


def test_the_kernel_is_measured_once_per_shape_and_then_read_from_the_cache(probe):
    """Before: every start of a run probed the four kernels again (and cuDNN built its kernels for it)."""
    first = choose()
    assert first[0] == "cudnn" and "probe 1" in first[1] and "measured now" in first[1]
    again = choose()
    assert again[0] == "cudnn" and "probe 1" in again[1] and "from the cache" in again[1]
    assert len(probe) == 1
    choose(seq=1024)  # another shape: its own entry
    assert [shape for shape, _ in probe] == [(64, 6, 256, 64), (64, 6, 1024, 64)]


def test_another_gpu_or_build_measures_again(probe, monkeypatch):
    choose()
    monkeypatch.setattr(attention, "gpu_key", lambda device: "NVIDIA H200 | torch x | cudnn 91000")
    choose()
    assert len(probe) == 2


@pytest.mark.parametrize("damaged", ["flash2", ["cudnn"], {"value": "cudnn"}, None, 3])
def test_a_damaged_cached_kernel_is_measured_again(probe, damaged):
    choose()
    path = choices.cache_path()
    data = json.loads(path.read_text())
    for entry in data.values():
        entry["value"] = damaged
    path.write_text(json.dumps(data))
    kernel, note = choose()
    assert kernel == "cudnn" and "measured now (the cached value was damaged)" in note and len(probe) == 2
