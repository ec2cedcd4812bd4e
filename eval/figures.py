"""The pictures of eval/inspect.py: attention heatmaps and the text coloured by surprisal (PNG figures with
matplotlib, and a self-contained HTML page without it).

Every function takes an `Inspection` (eval/inspect.py's inspect_tokens makes it) and returns a matplotlib
Figure or a string; none writes a file, draws a random number or touches pyplot's global state (the
figures are plain Figures on an Agg canvas, freed with their last reference), so the training loop can
call them as they are and hand the result to wandb (wandb.Image(fig), wandb.Html(html)) or to `figure_png`.
"""
from __future__ import annotations

import html
import io
import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from errors import to_stderr

from .drawing import drawable, matplotlib_agg, new_figure

# The surprisal colour scale, from 0 bits (white: the model was sure) to the surprisal of a uniform guess
# over the vocabulary (dark red): one scale for the PNG and the HTML, which needs no matplotlib.
RAMP = ((0.0, (255, 255, 255)), (0.2, (255, 237, 160)), (0.45, (254, 178, 76)), (0.7, (240, 59, 32)),
        (1.0, (128, 0, 38)))
SHOWN = {"\n": "↵", "\t": "⇥", " ": "␣", "\r": "␍"}  # whitespace made visible on the axes and in the cells
MAX_PNG_TOKENS = 256  # the surprisal PNG shows at most the last this many tokens (the HTML shows all)
MAX_TICKS = 64  # at most this many token labels along one axis of a heatmap


@dataclass
class Inspection:
    """What one forward pass over a text shows (eval/inspect.py's inspect_tokens makes it). T tokens, L
    layers, H heads."""

    ids: list[int]  # the T token ids
    labels: list[str]  # each token's text (tokenizer.decode([id]))
    attention: torch.Tensor  # (L, H, T, T) float32 on the CPU: row = query position, column = key position
    bits: list[float]  # surprisal of token t given tokens < t, -log2 p, in bits; nan for t = 0
    guesses: list[list[tuple[int, str, float]]]  # at position t, the top-k (id, text, p) for token t + 1
    vocab_size: int  # the tokenizer's (the colour scale tops out at a uniform guess over it)
    description: str = ""

    def mean_bits(self) -> float:
        """Mean surprisal per token, over tokens 1..T-1 (bits/token); nan for a single token."""
        rest = self.bits[1:]
        return sum(rest) / len(rest) if rest else math.nan


def figure_png(fig, dpi: int = 100) -> bytes:
    """The figure as PNG bytes."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def shown(label: str, limit: int = 12) -> str:
    """A token as it reads on an axis or in a cell: whitespace made visible, long tokens cut, and a
    character the figures' font lacks (CJK in DejaVu Sans Mono) as its escaped code point, \\u4e2d: else
    matplotlib draws a box and warns on stderr once per glyph, dozens of lines. Said once (drawable)."""
    text = "".join(_drawn(SHOWN.get(c, c if c.isprintable() else f"\\x{ord(c):02x}")) for c in label)
    return text if len(text) <= limit else text[: limit - 1] + "…"


_ESCAPED: set[str] = set()  # the characters drawn as code points so far (the note is said once per process)


def _drawn(text: str) -> str:
    glyphs = _font_glyphs()
    if glyphs is None or all(ord(c) in glyphs for c in text):
        return text
    out = []
    for c in text:
        if ord(c) in glyphs:
            out.append(c)
            continue
        out.append(f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}")
        if not _ESCAPED:
            to_stderr(f"note: the figures' font lacks some characters of this text (e.g. {c!r}); they are drawn "
                      f"as escaped code points ({out[-1]}); the HTML page shows them as they are")
        _ESCAPED.add(c)
    return "".join(out)


@lru_cache(maxsize=None)
def _font_glyphs() -> frozenset[int] | None:
    """The code points the monospace font of the token labels has (None: unknown, draw as is)."""
    try:
        mpl = matplotlib_agg()
        path = mpl.font_manager.findfont(mpl.font_manager.FontProperties(family="monospace"), fallback_to_default=True)
        return frozenset(mpl.ft2font.FT2Font(path).get_charmap())
    except Exception:  # noqa: BLE001 (no matplotlib, or a font it cannot read: drawing says what it says)
        return None


def ramp_rgb(bits: float, top: float) -> tuple[int, int, int]:
    t = 0.0 if not math.isfinite(bits) else min(max(bits / top, 0.0), 1.0)
    for (t0, c0), (t1, c1) in zip(RAMP, RAMP[1:]):
        if t <= t1:
            f = (t - t0) / (t1 - t0)
            return tuple(round(a + f * (b - a)) for a, b in zip(c0, c1))
    return RAMP[-1][1]


def hex_color(rgb: tuple[int, int, int]) -> str:
    return "#{:02x}{:02x}{:02x}".format(*rgb)


def ink(rgb: tuple[int, int, int]) -> str:
    """Black text on a light background, white on a dark one (by relative luminance)."""
    r, g, b = (c / 255 for c in rgb)
    return "#000000" if 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.45 else "#ffffff"


def scale_top(insp: Inspection) -> float:
    """The top of the colour scale: the surprisal of a uniform guess, log2(vocabulary), in bits."""
    return math.log2(max(insp.vocab_size, 2))


# ------------------------------------------------------------------------------------------ attention

def _heatmap(ax, weights, norm, cmap):
    w = weights.numpy()
    future = np.triu(np.ones_like(w, dtype=bool), k=1)  # causal: never attended, drawn apart from "weight 0"
    return ax.imshow(np.ma.masked_array(w, future), cmap=cmap, norm=norm, interpolation="nearest")


def _ticks(ax, labels: list[str], *, x: bool, y: bool, fontsize: float, limit: int = MAX_TICKS):
    step = max(1, math.ceil(len(labels) / limit))
    where = list(range(0, len(labels), step))
    names = [shown(labels[i]) for i in where]
    if x:
        ax.set_xticks(where, names, rotation=90, fontsize=fontsize, fontfamily="monospace")
    else:
        ax.set_xticks([])
    if y:
        ax.set_yticks(where, names, fontsize=fontsize, fontfamily="monospace")
    else:
        ax.set_yticks([])


def attention_figure(insp: Inspection, layer: int | None = None, head: int | None = None):
    """The attention weights as heatmaps (row = query token, column = the key token it attends to; the
    masked future is grey): every layer (rows) and head (columns) in one grid; `layer` alone: that layer's
    heads; `head` alone: that head in every layer; both: that one map, large, every token labelled.
    A square-root colour scale from 0 to 1, shared by every map, so that weak but spread-out attention
    (1/T each) still shows and maps compare with each other."""
    mpl = matplotlib_agg()
    att = insp.attention  # (L, H, T, T)
    L, H, T, _ = att.shape
    layers = [layer] if layer is not None else list(range(L))
    heads = [head] if head is not None else list(range(H))
    cmap = mpl.colormaps["viridis"].with_extremes(bad="#d9d9d9")
    norm = mpl.colors.PowerNorm(gamma=0.5, vmin=0.0, vmax=1.0)
    labels = insp.labels
    desc = drawable(insp.description)
    if len(layers) == 1 and len(heads) == 1:
        size = min(max(6.0, 0.16 * T + 2.0), 14.0)
        fig = new_figure((size + 1.2, size))
        ax = fig.subplots()
        image = _heatmap(ax, att[layers[0], heads[0]], norm, cmap)
        _ticks(ax, labels, x=True, y=True, fontsize=max(5.0, min(10.0, 0.6 * 72 * size / max(T, 1))))
        ax.set_xlabel("attended to (key)")
        ax.set_ylabel("attending (query)")
        ax.set_title(f"Attention weights, layer {layers[0]}, head {heads[0]}: {desc}", fontsize=10)
        fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02, label="weight")
        fig.tight_layout()
        return fig
    cell = min(3.2, max(1.2, 16.0 / max(len(layers), len(heads))))  # inches a map
    fig = new_figure((cell * len(heads) + 1.6, cell * len(layers) + 1.2))
    axes = fig.subplots(len(layers), len(heads), squeeze=False)
    image = None
    for r, li in enumerate(layers):
        for c, hi in enumerate(heads):
            ax = axes[r][c]
            image = _heatmap(ax, att[li, hi], norm, cmap)
            # the tokens along the left and bottom edges, one label every 7 points at most
            _ticks(ax, labels, x=r == len(layers) - 1, y=c == 0, fontsize=5.0, limit=int(cell * 72 / 7))
            ax.set_title(f"L{li} H{hi}", fontsize=8, pad=2)
    fig.suptitle(f"Attention weights (rows: layers, columns: heads; row = query, column = key): {desc}",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0, 0.93, 1))
    fig.colorbar(image, cax=fig.add_axes((0.945, 0.15, 0.012, 0.7)), label="weight")
    return fig


# ------------------------------------------------------------------------------------------ surprisal

def _guess_lines(insp: Inspection, t: int) -> list[tuple[str, float, bool]]:
    """The model's top guesses for token t (made at position t - 1): (label, probability, is it token t?)."""
    return [(label, p, i == insp.ids[t]) for i, label, p in insp.guesses[t - 1]] if t > 0 else []


def surprisal_figure(insp: Inspection, line_units: int = 96):
    """The text as coloured cells, in reading order (a new line after each newline token): each cell's
    colour is the token's surprisal, -log2 p(token | the text before it), with its value in bits; under it,
    the model's top guesses for that slot, in percent, the right one in bold. The first token has no
    surprisal (nothing predicts it). At most the last MAX_PNG_TOKENS tokens; the HTML shows them all."""
    mpl = matplotlib_agg()
    start = max(0, len(insp.ids) - MAX_PNG_TOKENS)
    k = len(insp.guesses[0]) if insp.guesses else 0
    cells = []  # (t, x, row, width) in character units
    x, row = 0, 0
    for t in range(start, len(insp.ids)):
        label = shown(insp.labels[t], 10)
        width = max([len(label), 3] + [len(shown(g, 6)) + 3 for g, _, _ in _guess_lines(insp, t)]) + 1
        if x and x + width > line_units:
            x, row = 0, row + 1
        cells.append((t, x, row, width))
        x += width
        if insp.labels[t].endswith("\n"):
            x, row = 0, row + 1
    rows = cells[-1][2] + 1 if cells else 1
    unit, row_h = 0.105, 0.42 + 0.14 * k  # inches per character unit, per row
    width, height = line_units * unit + 1.0, rows * row_h + 1.6  # + margins: title above, colour bar below
    fig = new_figure((width, height))
    ax = fig.add_axes((0.5 / width, 1.0 / height, line_units * unit / width, rows * row_h / height))
    ax.set_xlim(0, line_units)
    ax.set_ylim(rows * row_h / unit, 0)  # y in character units too, downwards
    ax.axis("off")
    top = scale_top(insp)
    for t, x, row, width in cells:
        y = row * row_h / unit
        rgb = ramp_rgb(insp.bits[t], top)
        ax.add_patch(mpl.patches.Rectangle((x, y), width - 0.4, 2.6, facecolor=hex_color(rgb), edgecolor="#bbbbbb",
                                           lw=0.4))
        ax.text(x + 0.3, y + 1.3, shown(insp.labels[t], 10), va="center", ha="left", fontsize=10,
                fontfamily="monospace", color=ink(rgb))
        bits = "" if t == 0 else f"{insp.bits[t]:.1f}"
        ax.text(x + 0.3, y + 3.3, bits, va="center", ha="left", fontsize=6, color="#444444")
        for j, (g, p, right) in enumerate(_guess_lines(insp, t)):
            ax.text(x + 0.3, y + 4.6 + 1.33 * j, f"{shown(g, 6)} {100 * p:.0f}", va="center", ha="left",
                    fontsize=6, fontfamily="monospace", color="#000000" if right else "#777777",
                    fontweight="bold" if right else "normal")
    kept = f"; the last {len(insp.ids) - start} of {len(insp.ids)} tokens" if start else ""
    fig.suptitle(f"Surprisal of each token in bits (colour and number), and the model's top-{k} guesses for it "
                 f"in % (bold: the right one); {insp.mean_bits():.2f} bits/token{kept}\n{drawable(insp.description)}",
                 fontsize=9)
    stops = [(s, tuple(c / 255 for c in rgb)) for s, rgb in RAMP]
    cmap = mpl.colors.LinearSegmentedColormap.from_list("surprisal", stops)
    mappable = mpl.cm.ScalarMappable(norm=mpl.colors.Normalize(0, top), cmap=cmap)
    bar = fig.add_axes((0.3, 0.45 / height, 0.4, 0.12 / height))
    fig.colorbar(mappable, cax=bar, orientation="horizontal", label="surprisal (bits); the right end: a uniform guess")
    return fig


CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px;background:#f4f4f4;color:#222}
h1{font-size:18px;margin:0 0 4px} p{margin:4px 0;font-size:13px;color:#555}
.text{font-family:ui-monospace,"DejaVu Sans Mono",Menlo,Consolas,monospace;font-size:18px;line-height:2.2;
 white-space:pre-wrap;background:#fff;border:1px solid #ccc;border-radius:6px;padding:16px;margin-top:12px}
.t{position:relative;padding:3px 1px;border-radius:3px;cursor:default}
.t:hover{outline:2px solid #222;z-index:2}
.t:hover::after{content:attr(data-tip);position:absolute;left:0;top:2.1em;z-index:3;background:#222;color:#fff;
 font-size:13px;line-height:1.45;padding:6px 9px;border-radius:4px;white-space:pre;pointer-events:none}
.next{color:#888;border:1px dashed #aaa}
.legend{display:flex;align-items:center;gap:8px;font-size:12px;color:#555;margin-top:8px}
.bar{width:260px;height:12px;border:1px solid #aaa;background:linear-gradient(to right,%s)}
"""


def _tip(insp: Inspection, t: int) -> str:
    if t == 0:
        head = f"{insp.labels[0]!r}: the first token (nothing predicts it)"
    else:
        head = f"{insp.labels[t]!r}: {insp.bits[t]:.2f} bits (p = {100 * 2 ** -insp.bits[t]:.1f}%)"
    lines = [f"{'▶' if right else ' '} {g!r:<14} {100 * p:5.1f}%" for g, p, right in _guess_lines(insp, t)]
    return "\n".join([head] + (["top guesses here:"] + lines if lines else []))


def surprisal_html(insp: Inspection, title: str = "Surprisal") -> str:
    """One self-contained HTML page (inline CSS, no script, no external asset): the text, each token's
    background coloured by its surprisal; hovering a token shows (a CSS tooltip; aria-label for screen
    readers) its surprisal and the model's top guesses for it with their probabilities; a last cell shows
    the guesses for the next token."""
    top = scale_top(insp)
    stops = ",".join(f"{hex_color(rgb)} {100 * s:.0f}%" for s, rgb in RAMP)
    spans = []
    for t, label in enumerate(insp.labels):
        rgb = ramp_rgb(insp.bits[t], top)
        tip = html.escape(_tip(insp, t), quote=True).replace("\n", "&#10;")
        text = html.escape(label.replace("\n", "↵"))
        spans.append(f'<span class="t" style="background:{hex_color(rgb)};color:{ink(rgb)}" data-tip="{tip}" '
                     f'aria-label="{tip}">{text}</span>' + "\n" * label.count("\n"))
    after = [(label, p, False) for _, label, p in insp.guesses[-1]]
    tip = "guesses for the next token:\n" + "\n".join(f"  {g!r:<14} {100 * p:5.1f}%" for g, p, _ in after)
    tip = html.escape(tip, quote=True).replace("\n", "&#10;")
    spans.append(f'<span class="t next" data-tip="{tip}" aria-label="{tip}">…</span>')
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>\n'
            f"<style>{CSS % stops}</style></head><body>\n<h1>{html.escape(title)}</h1>\n"
            f"<p>{len(insp.ids)} tokens, {insp.mean_bits():.3f} bits/token on "
            f"average (tokens 2 to {len(insp.ids)}). Hover a token for its surprisal and the model's top-"
            f"{len(insp.guesses[0])} guesses for it.</p>\n"
            f'<div class="legend">0 bits <span class="bar"></span> {top:.1f} bits (a uniform guess over '
            f"{insp.vocab_size} tokens)</div>\n"
            f'<div class="text">{"".join(spans)}</div>\n</body></html>\n')
