"""eval/inspect.py: the attention weights it draws are softmax(q k^T / sqrt(d) + causal mask) of the model's
own q and k, rebuilt here by hand; its surprisal is F.cross_entropy in bits; its HTML renders in a real
browser; it reads every kind of checkpoint; every bad input is one error line."""
from __future__ import annotations

import html
import math
import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import event, given, strategies as st

from checkpoint import save_checkpoint
from checkpoint.hf import write_hf_weights
from errors import UserError, run_cli
from eval import figures, inspect
from cli_lines import one_error_line
from figure_inputs import CHARS, TEXT, TOK, checkpoint_payload, tiny_model
import warm_runs

# ------------------------------------------------------------------------- the weights, rebuilt by hand

def rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rotate(x: torch.Tensor, base: float) -> torch.Tensor:
    """Rotary embedding from its formula: at position p, the pair (x_i, x_{i + hs/2}) turns by the angle
    p * base ** (-2i / hs)."""
    T, hs = x.shape[-2], x.shape[-1]
    out = torch.empty_like(x)
    for p in range(T):
        for i in range(hs // 2):
            a, b = x[..., p, i], x[..., p, i + hs // 2]
            c, s = math.cos(p * base ** (-2 * i / hs)), math.sin(p * base ** (-2 * i / hs))
            out[..., p, i], out[..., p, i + hs // 2] = a * c - b * s, b * c + a * s
    return out


OPTIONS = [dict(), dict(pos_embedding="rope"), dict(qk_norm=True), dict(pos_embedding="rope", qk_norm=True),
           dict(pos_embedding="rope", qk_norm=True, norm="rmsnorm", mlp_act="swiglu", logit_softcap=5.0, bias=False),
           dict(attn_backend="manual", pos_embedding="rope", qk_norm=True)]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "gpt2")
def test_drawn_weights_are_softmax_of_the_models_own_q_and_k_and_rebuild_its_attention_output(options):
    model = tiny_model(**options)
    cfg = model.config
    ids = TOK.encode(TEXT[:16])
    seen = {}  # each layer's input and output on the model's own path (SDPA unless manual)
    hooks = [block.attn.register_forward_hook(lambda m, args, out, i=i: seen.__setitem__(i, (args[0], out)))
             for i, block in enumerate(model.transformer.h)]
    with torch.no_grad():
        model(torch.tensor([ids]))
    for h in hooks:
        h.remove()
    insp = inspect.inspect_tokens(model, TOK, ids)
    assert insp.attention.shape == (cfg.n_layer, cfg.n_head, 16, 16)
    hs = cfg.n_embd // cfg.n_head
    for i, block in enumerate(model.transformer.h):
        x, y = seen[i]
        attn = block.attn
        qkv = x[0] @ attn.c_attn.weight.T + (attn.c_attn.bias if attn.c_attn.bias is not None else 0)
        q, k, v = (t.view(16, cfg.n_head, hs).transpose(0, 1) for t in qkv.split(cfg.n_embd, dim=-1))
        if cfg.qk_norm:
            q, k = rms(q, cfg.layer_norm_eps), rms(k, cfg.layer_norm_eps)
        if cfg.pos_embedding == "rope":
            q, k = rotate(q, cfg.rope_base), rotate(k, cfg.rope_base)
        scores = q @ k.transpose(-2, -1) / math.sqrt(hs)
        scores = scores.masked_fill(torch.ones(16, 16).triu(1).bool(), float("-inf"))
        weights = torch.softmax(scores, dim=-1)  # (H, T, T)
        torch.testing.assert_close(insp.attention[i], weights, atol=1e-6, rtol=1e-5)
        assert weights.max() > 0.9 and weights[:, -1].max() > 2 / 16, "attention too flat to prove anything"
        out = (weights @ v).transpose(0, 1).reshape(16, cfg.n_embd) @ attn.c_proj.weight.T
        out = out + (attn.c_proj.bias if attn.c_proj.bias is not None else 0)
        torch.testing.assert_close(out, y[0], atol=1e-5, rtol=1e-4)


def test_surprisal_is_the_cross_entropy_in_bits_and_guesses_are_the_top_5_probabilities():
    model = tiny_model(logit_softcap=4.0)
    ids = TOK.encode(TEXT[:12])
    insp = inspect.inspect_tokens(model, TOK, ids)
    with torch.no_grad():
        logits = model(torch.tensor([ids]))[0]
    expected = F.cross_entropy(logits[:-1], torch.tensor(ids[1:]), reduction="none") / math.log(2)
    assert math.isnan(insp.bits[0])
    torch.testing.assert_close(torch.tensor(insp.bits[1:]), expected, atol=1e-5, rtol=1e-5)
    assert insp.mean_bits() == pytest.approx(expected.mean().item(), rel=1e-5)
    probs = torch.softmax(logits, dim=-1)
    for t, row in enumerate(insp.guesses):
        top = probs[t].topk(5)
        assert [i for i, _, _ in row] == top.indices.tolist()
        assert [p for _, _, p in row] == pytest.approx(top.values.tolist(), rel=1e-5)
        assert [label for _, label, _ in row] == [TOK.decode([i]) for i in top.indices.tolist()]


def test_guesses_leave_out_the_ids_of_a_padded_vocabulary():
    model = tiny_model(vocab_size=TOK.vocab_size + 8, tie_embeddings=False)
    with torch.no_grad():  # the last norm gives the same vector b at every position, and the padded ids' rows
        ln_f = model.transformer.ln_f  # of the head are b's direction: they win every softmax
        ln_f.weight.zero_()
        ln_f.bias.normal_()
        model.lm_head.weight[TOK.vocab_size:] = ln_f.bias * 10 / ln_f.bias.pow(2).sum()
        model.lm_head.weight[: TOK.vocab_size] *= 0.01
    insp = inspect.inspect_tokens(model, TOK, TOK.encode(TEXT[:10]))
    assert all(i < TOK.vocab_size for row in insp.guesses for i, _, _ in row)
    assert max(p for row in insp.guesses for _, _, p in row) < 0.5  # the padded ids still take their share


def test_inspecting_draws_no_random_number_and_restores_the_train_mode():
    model = tiny_model(dropout=0.5).train()
    ids = TOK.encode(TEXT[:16])
    state = torch.get_rng_state()
    first = inspect.inspect_tokens(model, TOK, ids)
    assert torch.equal(torch.get_rng_state(), state)
    assert model.training and all(m.training for m in model.modules())
    assert all(not a.record_attention and a.attention is None for a in inspect.attention_layers(model))
    again = inspect.inspect_tokens(model, TOK, ids)  # no dropout: the same maps every time
    assert torch.equal(first.attention, again.attention)


def test_a_module_without_attention_layers_is_refused():
    with pytest.raises(UserError, match="no attention layers"):
        inspect.inspect_tokens(torch.nn.Sequential(torch.nn.Embedding(4, 4)), TOK, [0, 1])


# ------------------------------------------------------------------------------------------ the figures

def test_grid_has_one_titled_map_per_layer_and_head_with_the_tokens_on_the_edges():
    model = tiny_model(n_layer=3, n_head=2)
    insp = inspect.inspect_tokens(model, TOK, TOK.encode(TEXT[:8]))
    fig = figures.attention_figure(insp)
    maps = [ax for ax in fig.axes if ax.images]
    assert [ax.get_title() for ax in maps] == [f"L{l} H{h}" for l in range(3) for h in range(2)]
    for ax, (l, h) in zip(maps, [(l, h) for l in range(3) for h in range(2)]):
        drawn = ax.images[0].get_array()
        assert drawn.mask.tolist() == torch.ones(8, 8).triu(1).bool().tolist()  # the future: masked, grey
        torch.testing.assert_close(torch.tensor(drawn.filled(0)), insp.attention[l, h])
    assert [t.get_text() for t in maps[0].get_yticklabels()] == list("First␣Ci")
    assert [t.get_text() for t in maps[-1].get_xticklabels()] == list("First␣Ci")
    assert not maps[0].get_xticklabels() and not maps[-1].get_yticklabels()


@pytest.mark.parametrize("layer,head,titles", [(1, 0, ["layer 1, head 0"]), (1, None, ["L1 H0", "L1 H1"]),
                                               (None, 1, ["L0 H1", "L1 H1"])])
def test_layer_and_head_select_the_maps_and_both_give_one_large_map(layer, head, titles):
    insp = inspect.inspect_tokens(tiny_model(), TOK, TOK.encode(TEXT[:6]))
    fig = figures.attention_figure(insp, layer, head)
    maps = [ax for ax in fig.axes if ax.images]
    assert [ax.get_title().split(":")[0].replace("Attention weights, ", "") for ax in maps] == titles
    if len(maps) == 1:
        torch.testing.assert_close(torch.tensor(maps[0].images[0].get_array().filled(0)), insp.attention[1, 0])
        assert fig.get_size_inches()[1] >= 6


def test_surprisal_png_colours_each_token_by_its_bits_and_lists_its_guesses():
    insp = inspect.inspect_tokens(tiny_model(), TOK, TOK.encode(TEXT[:16]))
    fig = figures.surprisal_figure(insp)
    ax = fig.axes[0]
    top = math.log2(TOK.vocab_size)
    colours = [p.get_facecolor()[:3] for p in ax.patches]
    assert len(colours) == 16
    for t, colour in enumerate(colours):
        assert [round(255 * c) for c in colour] == list(figures.ramp_rgb(insp.bits[t], top))
    texts = [t.get_text() for t in ax.texts]
    _, label, p = insp.guesses[4][0]  # the top guess for token 5
    assert f"{insp.bits[5]:.1f}" in texts and f"{figures.shown(label, 6)} {100 * p:.0f}" in texts
    png = figures.figure_png(fig)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_colour_ramp_runs_from_white_at_zero_bits_to_dark_red_at_a_uniform_guess():
    assert figures.ramp_rgb(0.0, 6.0) == (255, 255, 255) and figures.ramp_rgb(math.nan, 6.0) == (255, 255, 255)
    assert figures.ramp_rgb(6.0, 6.0) == (128, 0, 38) == figures.ramp_rgb(60.0, 6.0)
    reds = [figures.ramp_rgb(b, 6.0) for b in (0.5, 2.0, 4.0, 5.5)]
    assert [sum(c) for c in reds] == sorted((sum(c) for c in reds), reverse=True)  # darker as the bits grow


def test_html_is_self_contained_and_every_token_carries_its_surprisal_and_top_5():
    insp = inspect.inspect_tokens(tiny_model(), TOK, TOK.encode(TEXT[:16]))
    page = figures.surprisal_html(insp, "a <title> & more")
    assert not re.search(r"<script|<link|src=|url\(|https?:|@import", page, re.I)
    assert "a &lt;title&gt; &amp; more" in page
    tips = re.findall(r'<span class="t" style="background:(#[0-9a-f]{6});[^"]*" data-tip="([^"]*)"', page)
    assert len(tips) == 16
    for t, (colour, tip) in enumerate(tips):
        assert colour == figures.hex_color(figures.ramp_rgb(insp.bits[t], math.log2(TOK.vocab_size)))
        tip = html.unescape(tip)
        if t:
            assert tip.startswith(f"{TEXT[t]!r}: {insp.bits[t]:.2f} bits")
            lines = tip.splitlines()[2:]
            assert [line.split()[-1] for line in lines] == [f"{100 * p:.1f}%" for _, _, p in insp.guesses[t - 1]]
            assert all(repr(label) in line for line, (_, label, _) in zip(lines, insp.guesses[t - 1]))
    assert sum("top guesses here:" in tip for _, tip in tips) == 15 and "guesses for the next token:" in page


def chromium_screenshot(html_path: Path, tmp_path: Path) -> Path:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium not installed: apt-get install chromium")
    shot = tmp_path / "shot.png"
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1000,800",
                    html_path.as_uri()], capture_output=True, timeout=120, check=True)
    return shot


def test_html_renders_in_headless_chromium_with_the_tokens_colours(tmp_path):
    from PIL import Image

    insp = inspect.inspect_tokens(tiny_model(), TOK, TOK.encode(TEXT[:16]))
    page = tmp_path / "surprisal.html"
    page.write_text(figures.surprisal_html(insp), encoding="utf-8")
    image = Image.open(chromium_screenshot(page, tmp_path)).convert("RGB")
    assert image.size == (1000, 800)
    pixels = np.asarray(image).reshape(-1, 3).astype(int)
    _, counts = np.unique(pixels, axis=0, return_counts=True)
    assert counts.max() < 0.97 * len(pixels), "the render is blank: almost all pixels one colour"
    worst = max(range(1, 16), key=lambda t: insp.bits[t])
    colour = figures.ramp_rgb(insp.bits[worst], math.log2(TOK.vocab_size))
    painted = int((np.abs(pixels - np.array(colour)) <= 2).all(axis=1).sum())
    assert painted >= 100, f"no token painted in {colour} (the most surprising token's colour)"


# ---------------------------------------------------------------------------------------- the CLI

@pytest.fixture(scope="module")
def char_ckpt(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ckpt") / "ckpt.pt"
    save_checkpoint(path, checkpoint_payload(tiny_model(pos_embedding="rope", qk_norm=True)))
    return path


def run(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        run_cli(lambda: inspect.main([str(a) for a in argv]))
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def make_source(kind: str, tmp_path: Path, char_ckpt: Path) -> tuple[str, str]:
    """A checkpoint of each kind sample.py loads -> (path, a text its tokenizer knows)."""
    if kind == "file":
        return str(char_ckpt), TEXT
    tmp_path.mkdir()
    if kind == "out_dir":
        shutil.copy(char_ckpt, tmp_path / "ckpt.pt")
        return str(tmp_path), TEXT
    if kind == "sharded":
        save_checkpoint(tmp_path / "ckpt.dcp", checkpoint_payload(tiny_model(norm="rmsnorm", mlp_act="swiglu")))
        return str(tmp_path / "ckpt.dcp"), TEXT
    model = tiny_model(vocab_size=50257, n_embd=8, n_head=2, block_size=16)  # GPT-2's vocabulary, for its tokenizer
    write_hf_weights(model, tmp_path)
    return str(tmp_path), "Hello, world! How are you?"


@pytest.mark.parametrize("kind", ["file", "out_dir", "sharded", "hf"])
def test_cli_writes_the_pictures_for_every_kind_of_checkpoint(kind, tmp_path, char_ckpt, capsys):
    spec, text = make_source(kind, tmp_path / "src", char_ckpt) if kind != "file" else (str(char_ckpt), TEXT)
    code, out, err = run(["--checkpoint", spec, "--text", text[:12], "--out", tmp_path / "pics"], capsys)
    assert code == 0, err
    names = ["attention.png", "surprisal.png", "surprisal.html"]
    assert out.split() == [str(tmp_path / "pics" / n) for n in names]
    assert min(png_size(tmp_path / "pics" / "attention.png")) > 300
    assert png_size(tmp_path / "pics" / "surprisal.png")[0] > 500
    assert (tmp_path / "pics" / "surprisal.html").read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert re.fullmatch(r"eval\.inspect: .*: \d+ tokens, \d+\.\d{3} bits/token\n", err)


def test_cli_zooms_into_one_map_and_a_long_text_keeps_its_last_block_size_tokens(char_ckpt, tmp_path, capsys):
    code, out, err = run(["--checkpoint", char_ckpt, "--text", TEXT, "--out", tmp_path, "--layer", 1, "--head", 0],
                         capsys)
    assert code == 0, err
    assert out.split()[-1] == str(tmp_path / "attention_L1_H0.png")
    width, height = png_size(tmp_path / "attention_L1_H0.png")
    assert height >= 600
    note = err.splitlines()[0]
    assert note.startswith(f"eval.inspect: the text is {len(TEXT)} tokens, longer than block_size (16): only its "
                           f"last 16 are inspected, from {TEXT[-16:]!r}")
    page = (tmp_path / "surprisal.html").read_text(encoding="utf-8")
    shown = re.findall(r'<span class="t" [^>]*>([^<]*)</span>', page)
    assert "".join(shown).replace("↵", "\n") == TEXT[-16:]


def test_text_ids_keep_the_last_block_size_tokens_and_refuse_nothing_to_predict():
    notes = []
    assert inspect.text_ids(TOK, TEXT, 16, notes.append) == TOK.encode(TEXT)[-16:] and len(notes) == 1
    assert inspect.text_ids(TOK, "Fi", 16, notes.append) == TOK.encode("Fi") and len(notes) == 1
    for text, words in (("", "empty"), ("F", "single token")):
        with pytest.raises(UserError, match=words):
            inspect.text_ids(TOK, text, 16, notes.append)


def bad_checkpoint(tmp_path: Path, what: str) -> Path:
    model = tiny_model()
    payload = checkpoint_payload(model)
    if what == "no attention weights":
        payload["model"] = {k: v for k, v in payload["model"].items() if ".attn." not in k}
    else:
        del payload["model"]
    save_checkpoint(tmp_path / "ckpt.pt", payload)
    return tmp_path / "ckpt.pt"


@pytest.mark.parametrize("setup,argv,words", [
    (None, ["--text", ""], ["text is empty"]),
    (None, ["--text", "F"], ["single token"]),
    (None, ["--text", "Zebra"], ["not in the char vocabulary"]),
    (None, ["--text", TEXT, "--layer", "2"], ["--layer 2 is out of range", "2 layers, 0 to 1"]),
    (None, ["--text", TEXT, "--head", "-1"], ["--head -1 is out of range"]),
    (None, ["--text", TEXT, "--head", str(10**30)], ["--head 1000000000000000000000000000000 is out of range"]),
    (None, ["--text", TEXT, "--layer", "x"], ["invalid int value"]),
    (None, ["--text", TEXT, "--text-file", "f"], ["not allowed with"]),
    ("out_file", ["--text", TEXT], ["is a file, not a directory"]),
    ("out_under_file", ["--text", TEXT], ["lies under a file"]),
    ("out_proc", ["--text", TEXT], ["--out"]),
    ("out_loop", ["--text", TEXT], ["--out=", "pics is a symlink to nothing (or a loop)"]),  # not "attention.png"
    ("text_missing", [], ["does not exist"]),
    ("text_dir", [], ["is a directory"]),
    ("text_fifo", [], ["--text-file", "text.txt is empty"]),  # no process writes it: read as empty, never waited on
    ("text_latin1", [], ["not valid UTF-8", "byte 0xe9 at byte offset 1"]),
    ("ckpt_missing", ["--text", TEXT], ["does not exist"]),
    ("ckpt_fifo", ["--text", TEXT], ["is not a regular file"]),
    ("ckpt_text", ["--text", TEXT], ["is not a PyTorch checkpoint"]),
    ("ckpt_no_attention", ["--text", TEXT], ["weights do not match"]),
    ("ckpt_no_model", ["--text", TEXT], ["no 'model' entry"]),
])
def test_bad_inputs_are_one_line_errors_and_write_no_picture(setup, argv, words, char_ckpt, tmp_path, capsys):
    ckpt, out = char_ckpt, tmp_path / "pics"
    if setup == "out_file":
        out.write_text("x")
    elif setup == "out_under_file":
        (tmp_path / "f").write_text("x")
        out = tmp_path / "f" / "pics"
    elif setup == "out_proc":
        out = Path("/proc/inspect-pics")
    elif setup == "out_loop":
        out.symlink_to(out.name)
    elif setup.startswith("text_") if setup else False:
        path = tmp_path / "text.txt"
        if setup == "text_dir":
            path.mkdir()
        elif setup == "text_fifo":
            os.mkfifo(path)
        elif setup == "text_latin1":
            path.write_bytes("Fé".encode("latin-1"))
        argv = ["--text-file", path]
    elif setup and setup.startswith("ckpt_"):
        ckpt = tmp_path / "c.pt"
        if setup == "ckpt_fifo":
            os.mkfifo(ckpt)
        elif setup == "ckpt_text":
            ckpt.write_text("not a checkpoint\n")
        elif setup == "ckpt_no_attention":
            ckpt = bad_checkpoint(tmp_path, "no attention weights")
        elif setup == "ckpt_no_model":
            ckpt = bad_checkpoint(tmp_path, "no model")
    code, _, err = run(["--checkpoint", ckpt, *argv, "--out", out], capsys)
    one_error_line(code, err, *words)
    assert not any(p.suffix in (".png", ".html") for p in tmp_path.rglob("*"))


def test_out_never_replaces_the_text_file_it_reads(char_ckpt, tmp_path, capsys):
    (tmp_path / "surprisal.html").write_text(TEXT)
    code, _, err = run(["--checkpoint", char_ckpt, "--text-file", tmp_path / "surprisal.html", "--out", tmp_path],
                       capsys)
    one_error_line(code, err, f"--out {tmp_path / 'surprisal.html'} is the --text-file", "choose another --out")
    assert (tmp_path / "surprisal.html").read_text() == TEXT


def test_the_real_command_prints_one_error_line_without_traceback(tmp_path):
    root = Path(__file__).resolve().parents[1]
    done = warm_runs.run(["-m", "eval.inspect", "--checkpoint", tmp_path / "nope.pt", "--text", "hi", "--out", tmp_path],
                         cwd=root)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and done.stderr.startswith("error: checkpoint")


# ------------------------------------------------------------------------------------ the property

PATH_KINDS = ["new", "nested", "existing_dir", "file", "under_file", "fifo", "devnull", "proc"]
CKPT_KINDS = ["good", "missing", "empty_dir", "fifo", "text"]


def make_path(kind: str, root: Path, char_ckpt: Path | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    if kind == "good":
        return char_ckpt
    if kind in ("new", "missing"):
        return root / "x.pt"
    if kind == "nested":
        return root / "a" / "b"
    if kind in ("existing_dir", "empty_dir"):
        (root / "d").mkdir()
        return root / "d"
    if kind in ("file", "text"):
        (root / "f").write_text("text\n")
        return root / "f"
    if kind == "under_file":
        (root / "f").write_text("text\n")
        return root / "f" / "x"
    if kind == "fifo":
        os.mkfifo(root / "fifo")
        return root / "fifo"
    return Path("/dev/null") if kind == "devnull" else Path("/proc/inspect-out")


# the lists repeat the kinds that work, so that the pictures are drawn in some of the few examples CI runs
INDEX = st.one_of(st.none(), st.integers(0, 1), st.integers(-3, 3), st.integers(-2**70, 2**70))


@given(text=st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40)
       | st.text(alphabet=CHARS, max_size=40) | st.text(alphabet=CHARS, min_size=2, max_size=40),
       layer=INDEX, head=INDEX, out_kind=st.sampled_from(PATH_KINDS + ["new"] * 4),
       ckpt_kind=st.sampled_from(CKPT_KINDS + ["good"] * 6),
       from_file=st.booleans())
def test_any_arguments_give_the_pictures_or_one_error_line(text, layer, head, out_kind, ckpt_kind, from_file,
                                                            char_ckpt, tmp_path_factory, capsys):
    root = tmp_path_factory.mktemp("prop")
    out = make_path(out_kind, root / "out")
    ckpt = make_path(ckpt_kind, root / "ckpt", char_ckpt)
    argv = ["--checkpoint", ckpt, "--out", out]
    if from_file:
        (root / "text.txt").write_text(text, encoding="utf-8")
        argv += ["--text-file", root / "text.txt"]
    else:
        argv += ["--text", text]
    argv += (["--layer", layer] if layer is not None else []) + (["--head", head] if head is not None else [])
    code, stdout, err = run(argv, capsys)
    event("pictures drawn" if code == 0 else "one error line")  # --hypothesis-show-statistics: both happen
    if code == 2:
        one_error_line(code, err)
        assert not stdout
        return
    assert code == 0 and ckpt_kind == "good" and out_kind in ("new", "nested", "existing_dir"), err
    assert 2 <= len(TOK.encode(text)) and all(0 <= i < 2 for i in (layer, head) if i is not None)
    for line in stdout.split():
        assert Path(line).parent == out and Path(line).stat().st_size > 1000
    assert len(stdout.split()) == 3 + (layer is not None or head is not None)
