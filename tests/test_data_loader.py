"""BatchLoader: windows of the split, deterministic in (seed, step), independent of the rank layout."""
from __future__ import annotations

import io

import numpy as np
import pytest
import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st
import torch

from data import BatchLoader, DataConfig, prepare_data
from errors import UserError
from prepared_files import read_split, tail_cut

BLOCK = 64


@pytest.fixture(scope="module")
def char_dir(tmp_path_factory):
    return prepare_data(DataConfig(tokenizer="char", root=str(tmp_path_factory.mktemp("prepared"))), progress=False)


@pytest.fixture(scope="module")
def train_tokens(char_dir) -> np.ndarray:
    return np.array(read_split(char_dir, "train"), dtype=np.int64)


def loader(d, split="train", **kw) -> BatchLoader:
    args = dict(block_size=BLOCK, batch_size=8, seed=1234)
    args.update(kw)
    return BatchLoader(d, split, **args)


def test_batch_rows_are_windows_of_the_split_with_y_one_token_ahead(char_dir, train_tokens):
    ld = loader(char_dir)
    x, y = ld.get_batch(step=3)
    assert x.shape == y.shape == (8, BLOCK) and x.dtype == y.dtype == torch.int64
    assert x.is_contiguous() and y.is_contiguous()
    for row_x, row_y, start in zip(x.numpy(), y.numpy(), ld.offsets(3)):
        assert 0 <= start <= len(train_tokens) - BLOCK - 1
        np.testing.assert_array_equal(row_x, train_tokens[start : start + BLOCK])
        np.testing.assert_array_equal(row_y, train_tokens[start + 1 : start + BLOCK + 1])


def test_same_seed_and_step_give_the_same_batch_and_others_differ(char_dir):
    a, b = loader(char_dir), loader(char_dir)
    for step in (0, 1, 17):
        assert all(torch.equal(p, q) for p, q in zip(a.get_batch(step), b.get_batch(step)))
    assert not torch.equal(a.get_batch(0)[0], a.get_batch(1)[0])
    assert not torch.equal(a.get_batch(0)[0], a.get_batch(0, micro_step=1)[0])
    assert not torch.equal(a.get_batch(0)[0], loader(char_dir, seed=1235).get_batch(0)[0])
    assert not np.array_equal(a.offsets(0), loader(char_dir, "val").offsets(0))


def test_resuming_at_step_k_replays_the_uninterrupted_batches(char_dir):
    run = loader(char_dir)
    uninterrupted = [run.get_batch(step, micro) for step in range(6) for micro in range(2)]
    state = run.state_dict()
    resumed = loader(char_dir, seed=999)  # the checkpoint's seed wins
    resumed.load_state_dict(state)
    replay = [resumed.get_batch(step, micro) for step in range(3, 6) for micro in range(2)]
    for (x1, y1), (x2, y2) in zip(uninterrupted[6:], replay):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)


@pytest.mark.parametrize("world_size, grad_accum", [(2, 2), (4, 1)])
def test_ranks_split_the_same_global_batch_as_one_process(char_dir, world_size, grad_accum):
    single = loader(char_dir)
    total_micro = world_size * grad_accum
    expected = torch.cat([single.get_batch(5, m)[0] for m in range(total_micro)])
    ranks = [loader(char_dir, rank=r, world_size=world_size) for r in range(world_size)]
    # global order: micro step, then rank, then row
    got = torch.cat([ranks[r].get_batch(5, m)[0] for m in range(grad_accum) for r in range(world_size)])
    assert torch.equal(got, expected)


def test_offsets_spread_over_the_whole_split(char_dir, train_tokens):
    ld = loader(char_dir, batch_size=64)
    starts = np.concatenate([ld.offsets(s) for s in range(200)])
    n_starts = len(train_tokens) - BLOCK
    assert starts.min() >= 0 and starts.max() < n_starts
    counts, _ = np.histogram(starts, bins=10, range=(0, n_starts))
    assert counts.min() > 0.8 * len(starts) / 10  # roughly uniform, nothing stuck in one region
    assert len(np.unique(starts)) > 0.99 * len(starts)


def test_a_split_of_exactly_block_size_plus_one_tokens_gives_that_window(tmp_path):
    (tmp_path / "t.txt").write_text("abcdefghij" * 10, encoding="utf-8")
    d = prepare_data(DataConfig(dataset=str(tmp_path / "t.txt"), tokenizer="char", root=str(tmp_path)), progress=False)
    x, y = BatchLoader(d, "val", block_size=9, batch_size=3, seed=0).get_batch(0)
    assert torch.equal(x, torch.arange(9).repeat(3, 1)) and torch.equal(y, torch.arange(1, 10).repeat(3, 1))


def test_bytes_per_token_is_the_splits_utf8_bytes_over_its_tokens(char_dir, tmp_path):
    assert loader(char_dir).bytes_per_token == 1.0  # one ASCII character per char token
    text = "Unicode costs more bytes: naïve café 🎉, 日本語. " * 20
    (tmp_path / "u.txt").write_text(text, encoding="utf-8")
    d = prepare_data(DataConfig(dataset=str(tmp_path / "u.txt"), root=str(tmp_path), val_fraction=0.5), progress=False)
    train = tiktoken.get_encoding("gpt2").encode_ordinary(text[: tail_cut(text, 0.5)])
    expected = len(tiktoken.get_encoding("gpt2").decode_bytes(train)) / len(train)
    assert BatchLoader(d, "train", block_size=8, batch_size=1, seed=0).bytes_per_token == pytest.approx(expected)


def test_state_dict_is_plain_python_that_survives_a_weights_only_checkpoint(char_dir):
    state = loader(char_dir).state_dict()
    assert all(isinstance(v, (str, int)) for v in state.values())
    buf = io.BytesIO()
    torch.save({"loader": state}, buf)
    buf.seek(0)
    assert torch.load(buf, weights_only=True)["loader"] == state


def test_resuming_on_different_data_is_refused(char_dir, tmp_path):
    (tmp_path / "other.txt").write_text("some other text entirely " * 50, encoding="utf-8")
    other = prepare_data(DataConfig(dataset=str(tmp_path / "other.txt"), tokenizer="char", root=str(tmp_path)), progress=False)
    state = loader(char_dir).state_dict()
    with pytest.raises(UserError) as e:
        loader(other, block_size=8).load_state_dict(state)
    assert "different data" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(UserError, match="split"):
        loader(char_dir, "val").load_state_dict(state)


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(rank=2, world_size=2), "rank"),
        (dict(block_size=0), "block_size"),
        (dict(batch_size=-1), "batch_size"),
        (dict(seed=-5), "seed"),
    ],
)
def test_bad_loader_arguments_are_user_errors(char_dir, kw, words):
    with pytest.raises(UserError, match=words):
        loader(char_dir, **kw)


def test_unknown_split_is_a_user_error(char_dir):
    with pytest.raises(UserError, match="train, val"):
        loader(char_dir, "test")


# tiny shakespeare's val split has 111529 tokens: 111528 targets are 8 x 13941, and 64 leaves 40 over
@pytest.mark.parametrize("block", [8, 64, 13941, 111528])
def test_sequential_batches_predict_every_token_of_the_split_once_in_order(char_dir, block):
    # the split's own file is the reference: windows k*block .. k*block+block, so the targets y are tokens
    # 1 .. n*block, once each, and no window reads past the end
    split = np.array(read_split(char_dir, "val"), dtype=np.int64)
    ld = loader(char_dir, "val", block_size=block, batch_size=3)
    n = (len(split) - 1) // block
    assert ld.num_windows() == n
    batches = [ld.sequential_batch(k) for k in range(-(-n // 3))]
    xs, ys = torch.cat([x for x, _ in batches]).numpy(), torch.cat([y for _, y in batches]).numpy()
    assert xs.shape == (n, block)
    np.testing.assert_array_equal(ys.reshape(-1), split[1 : n * block + 1])
    np.testing.assert_array_equal(xs.reshape(-1), split[: n * block])
    with pytest.raises(ValueError, match="past the"):
        ld.sequential_batch(len(batches))


@pytest.fixture(scope="module")
def sharded_dir(tmp_path_factory):
    """Tiny shakespeare's characters in shards of 1000 tokens: many windows cross a file boundary."""
    return prepare_data(DataConfig(tokenizer="char", shard_tokens=1000, root=str(tmp_path_factory.mktemp("sharded"))),
                        progress=False)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_any_windows_are_the_streams_slices_across_shard_files(sharded_dir, data):
    """BatchLoader._windows (one gather per file, piecewise across a boundary) against the split's stream read
    whole (prepared_files.read_split): any starts, anywhere, in any order, repeated, at the very end, over
    files of 1000 tokens with windows up to 2.5 files long."""
    stream = _sharded_stream(sharded_dir)
    block = data.draw(st.sampled_from([1, 7, 64, 999, 1000, 2500]), label="block_size")
    ld = _LOADERS.get(block) or _LOADERS.setdefault(block, BatchLoader(sharded_dir, "train", block_size=block,
                                                                         batch_size=1, seed=0))
    last = len(stream) - block - 1
    starts = data.draw(st.lists(st.one_of(st.integers(0, last), st.sampled_from([0, last, 999, 1000, 1001])),
                                min_size=1, max_size=12), label="starts")
    got = ld._windows(np.array(starts, dtype=np.int64))
    assert got.shape == (len(starts), block + 1)
    for row, start in zip(got, starts):
        np.testing.assert_array_equal(row, stream[start: start + block + 1])


_STREAMS: dict = {}
_LOADERS: dict = {}  # by block size: making one checks every shard's ids


def _sharded_stream(d) -> np.ndarray:
    if d not in _STREAMS:
        _STREAMS[d] = np.array(read_split(d, "train"), dtype=np.int64)
    return _STREAMS[d]


def test_the_sharded_split_has_many_files(sharded_dir):
    ld = BatchLoader(sharded_dir, "train", block_size=8, batch_size=1, seed=0)
    assert len(ld._files) > 100


# ------------------------------------------------------------------ a checkpoint's loader entry that does not fit

# each way a loader entry can fail to fit, with the words of the cause its line must name (an independent table:
# "trained on different data" only for other tokens, "malformed" only for an entry that cannot be read)
ODD_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-3, -1), st.floats(allow_nan=False), st.text(max_size=4),
                       st.lists(st.integers(), max_size=2))


@settings(max_examples=40, deadline=None)
@given(case=st.one_of(
    st.tuples(st.just("not a dict"), st.one_of(st.lists(st.integers(), max_size=2), st.text(max_size=4), st.none())),
    st.tuples(st.sampled_from(["tokens_sha256", "split", "seed"]), st.one_of(st.just("<missing>"), ODD_VALUES)),
    st.tuples(st.just("other tokens"), st.text("0123456789abcdef", min_size=1, max_size=64)),
    st.tuples(st.just("other split"), st.just("val"))))
def test_each_cause_of_a_loader_entry_that_does_not_fit_is_one_line_naming_that_cause(char_dir, case):
    """Before: the checkpointer read every refusal of the loader as "its 'loader' entry is malformed (...)", the
    different data's included, and an entry without a fingerprint as "trained on different data (None vs ..)"."""
    from checkpoint.checkpointer import Checkpointer

    kind, value = case
    good = loader(char_dir).state_dict()
    if kind == "not a dict":
        entry = value
    elif kind == "other tokens":
        entry = good | {"tokens_sha256": value if value != good["tokens_sha256"] else value + "0"}
    elif kind == "other split":
        entry = good | {"split": value}
    elif value == "<missing>":
        entry = {k: v for k, v in good.items() if k != kind}
    else:
        if kind == "seed" and type(value) is int and value >= 0 or kind in ("tokens_sha256", "split") \
                and isinstance(value, str):
            return  # (a readable value: the other cases draw those)
        entry = good | {kind: value}
    ckpt = Checkpointer("out")
    ckpt.register("loader", loader(char_dir))
    with pytest.raises(UserError) as e:
        ckpt.restore_states({"loader": entry}, "out/ckpt.pt")
    line = str(e.value)
    assert "\n" not in line and line.startswith("checkpoint out/ckpt.pt: "), line
    expected = ([f"a {type(value).__name__}, not the dict"] if kind == "not a dict"
                else ["trained on different data", entry["tokens_sha256"][:12]] if kind == "other tokens"
                else ["'val' split's, not the 'train' split's"] if kind == "other split" else [f"{kind} is "])
    assert all(words in line for words in expected), (expected, line)
    assert ("malformed" in line) == (kind not in ("other tokens", "other split")), line
    assert ("different data" in line) == (kind == "other tokens"), line
