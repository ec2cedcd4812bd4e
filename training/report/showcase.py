"""What a run shows of itself while it trains, so that it can be watched learning:

- samples (eval.sample_interval): the model continues each of eval.sample_prompts (empty: the data's
  default, `default_prompts`) by eval.sample_tokens tokens, drawn with a private generator seeded with
  train.seed afresh each round. The run's own random streams never move, so a run with samples trains
  bit for bit like one without, and two rounds differ only by what the model learned between them. The
  text goes to the console, to metrics.jsonl (the step's record, under "samples") and to wandb (the
  table "samples": step, prompt, text; every row so far, since wandb shows a table's last version);
- the inside of the model (eval.inspect_interval): eval/inspect.py's attention maps of every layer and
  head and the per-token surprisal, on a fixed snippet: the first INSPECT_TOKENS tokens of the val split
  (block_size if smaller). To wandb (two images, the HTML page, the snippet's bits per token) and to
  <out_dir>/inspect/step-<N>/ (attention.png, surprisal.png, surprisal.html).

Both are forwards of the model: every rank that takes part in a forward runs them (Parallel.evaluates:
under FSDP every rank, which gathers each block's weights), each rank the same number of forwards (the
samples never stop early at an end of text: the text is cut there afterwards), and rank 0 reports.
A resumed run's table starts with the rows metrics.jsonl holds of the steps before it resumed, so it
logs the same table at the same steps as the run that was never interrupted.

    showcase = build_showcase(cfg, tokenizer)   # set-up: prompts checked, before the model is built
    record |= r.showcase.after_step(r, due)           # the loop: whatever is due; the record for metrics.jsonl

training/timing/budget.py times one round of each (`samples`, `inspect`) into a time budget's plan.
"""
from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import torch

from bounded import TooLarge, read_at_most
from data import Tokenizer, tokenizer_from_meta
from data.chat_template import ChatTemplate, template_for
from data.config import SHAKESPEARE
from errors import UserError, short_error, write_fix
from eval.figures import Inspection, attention_figure, figure_png, surprisal_figure, surprisal_html
from eval.inspect import inspect_tokens
from fileio import atomic_write_bytes, no_empty_dirs_left
from model.generate import generate
from runtime.sampling import Sampling
from runtime.text import DEFAULT_PROMPT

from ..chat import DEFAULT_QUESTIONS, MarkedTokenizer, chat_prompts
from ..config.sections import Config
from ..timing.schedule import Due

SAMPLES = "samples"  # the metrics.jsonl record's key and the wandb table's
COLUMNS = ["step", "prompt", "text"]
TEMPERATURE, TOP_K = Sampling.temperature, Sampling.top_k
DEFAULT_PROMPTS = {SHAKESPEARE: ["ROMEO:", "JULIET:"]}  # by data.dataset; other data: sample.py's (a new line)
INSPECT_TOKENS = 64  # the attention grid stays readable (eval/figures.py labels at most 64 tokens an axis)
INSPECT_DIR = "inspect"
IMAGES = {"inspect/attention": "attention.png", "inspect/surprisal": "surprisal.png"}  # wandb key -> file of step-N/
HTML_KEY, HTML_NAME = "inspect/surprisal_html", "surprisal.html"
MAX_HTML_BYTES = 64 << 20  # a page of a few thousand tokens is ~1 MB


def default_prompts(dataset: str) -> list[str]:
    return DEFAULT_PROMPTS.get(dataset, [DEFAULT_PROMPT])


def prompt_ids(tok: Tokenizer, prompts: list[str], given: bool) -> list[tuple[str, list[int]]]:
    """(text, ids) of each prompt; a prompt the tokenizer can't encode is one line naming it. A default
    prompt the vocabulary lacks (a char vocabulary without a new line) starts from the end-of-text token."""
    out = []
    for i, text in enumerate(prompts, 1):
        try:
            ids = tok.encode(text)
        except UserError as e:
            if not given:
                ids = []
            else:
                shown = repr(text) if len(text) <= 40 else repr(text[:37]) + "..."
                raise UserError(f"eval.sample_prompts: prompt {i} ({shown}) cannot be encoded by the {tok.name} "
                                f"tokenizer: {e}") from None
        out.append((text, ids) if ids else (tok.decode([tok.eot]), [tok.eot]))
    return out


@dataclass
class Showcase:
    """Built once by build_showcase; the loop calls after_step. Off (nothing due) without a tokenizer."""
    tok: Tokenizer | None = None
    prompts: list[tuple[str, list[int]]] = field(default_factory=list)  # (text, token ids)
    tokens: int = 0  # generated after each prompt
    seed: int = 0
    rows: list[list[Any]] | None = None  # rank 0: the table so far (None: not yet read back from metrics.jsonl)
    snippet: list[int] | None = None  # the val tokens inspected, read at the first inspection
    template: ChatTemplate | None = None  # a chat run's: prompts end with <|assistant|>, replies end at <|end|>

    def after_step(self, r, due: Due) -> dict[str, Any]:
        """Whatever of the two is due after this step (r: the Run), logged; returns the metrics.jsonl record."""
        record: dict[str, Any] = {}
        if not (due.sample or due.inspect):
            return record
        with r.par.waiting("the samples' and maps' forwards", patient=True, grace_s=math.inf):  # FSDP: every rank's
            if due.sample:
                record |= self._log_samples(r)
            if due.inspect:
                record |= self._log_inspection(r)
        if not r.par.joint_forward:  # rank 0 alone drew them: the others wait for it here, patiently
            r.par.broadcast(None, "rank 0's samples and maps", patient=True)
        return record

    # ---------------------------------------------------------------------------------- samples
    def samples(self, r) -> list[tuple[str, str]] | None:
        """One round: (prompt, generated text) per prompt on rank 0, None elsewhere. In eval mode (no
        dropout), under the run's autocast, every prompt in one batch, without the KV cache (the same plain
        forwards as the evals, whatever the sharding), a fixed number of forwards on every rank."""
        if not r.par.evaluates:
            return None
        model, tok = r.trainer.model, self.tok
        eot = self.template.end if self.template is not None else tok.eot  # MarkedTokenizer: the chat vocab
        generator = torch.Generator(device=r.device).manual_seed(self.seed)  # private: no run stream moves
        was_training = model.training
        model.eval()
        try:
            with r.trainer.amp():
                out = generate(model, [ids for _, ids in self.prompts], self.tokens, temperature=TEMPERATURE,
                               top_k=TOP_K, generator=generator, eot=eot, stop_at_eot=False, use_cache=False,
                               vocab_size=tok.vocab_size)
        finally:
            model.train(was_training)
        if not r.par.is_main:
            return None
        template = self.template
        decode = tok.decode if template is None else (lambda ids: template.decode(tok.tok, ids))
        return [(text, decode(ids[: ids.index(eot)] if eot in ids else ids))
                for (text, _), ids in zip(self.prompts, out)]

    def _log_samples(self, r) -> dict[str, Any]:
        pairs = self.samples(r)
        if pairs is None:
            return {}
        step = r.state.iter
        if self.rows is None:
            self.rows = earlier_rows(r.log.metrics.kept, step)
        self.rows += [[step, prompt, text] for prompt, text in pairs]
        for i, (prompt, text) in enumerate(pairs, 1):
            shown = f"{prompt}{text}" if self.template is None else f"user: {prompt}\nassistant: {text}"
            r.log.say(f"iter {step}: sample {i}/{len(pairs)}:\n{shown}")
        r.log.wandb.log_table(SAMPLES, COLUMNS, self.rows, step)
        return {SAMPLES: [{"prompt": prompt, "text": text} for prompt, text in pairs]}

    # ------------------------------------------------------------------------------- inspection
    def inspect(self, r) -> tuple[Inspection, dict[str, bytes]] | None:
        """The fixed val snippet's inspection (one forward, no random draw) and its pictures by file name,
        on rank 0; None elsewhere."""
        if not r.par.evaluates:
            return None
        if self.snippet is None:
            x, _ = r.trainer.eval_loaders["val"].sequential_batch(0)  # windows in order: row 0 starts the split
            self.snippet = x[0, :INSPECT_TOKENS].tolist()
        insp = inspect_tokens(r.trainer.model, self.tok, self.snippet, description=f"iter {r.state.iter}")
        if not r.par.is_main:
            return None
        return insp, {IMAGES["inspect/attention"]: figure_png(attention_figure(insp)),
                      IMAGES["inspect/surprisal"]: figure_png(surprisal_figure(insp)),
                      HTML_NAME: surprisal_html(insp, f"Surprisal at iter {r.state.iter}").encode("utf-8")}

    def _log_inspection(self, r) -> dict[str, Any]:
        made = self.inspect(r)
        if made is None:
            return {}
        insp, pictures = made
        step, bits = r.state.iter, insp.mean_bits()
        folder = Path(r.cfg.train.out_dir) / INSPECT_DIR / f"step-{step}"
        with no_empty_dirs_left(folder):  # a failed write leaves none of the folders made for it
            for name, data in pictures.items():
                try:
                    folder.mkdir(parents=True, exist_ok=True)
                    atomic_write_bytes(folder / name, data, what="eval.inspect_interval's picture")
                except OSError as e:
                    raise UserError(f"cannot write {folder / name} ({short_error(e)}); "
                                    f"{write_fix(e, 'set eval.inspect_interval=0')}, then rerun the same command to "
                                    "resume") from None
        r.log.wandb.log_media(step, images={key: str(folder / name) for key, name in IMAGES.items()},
                              html={HTML_KEY: pictures[HTML_NAME].decode("utf-8")}, values={"inspect/bits_per_token": bits})
        r.log.say(f"iter {step}: attention maps and surprisal of the val split's first {len(insp.ids)} tokens "
                  f"({bits:.3f} bits/token) in {folder}")
        return {"inspect/bits_per_token": bits}


def sample_rows(record: dict[str, Any]) -> list[list[Any]]:
    """The table's rows of one metrics.jsonl record: [step, prompt, text] for each sample it holds."""
    if not isinstance(record.get(SAMPLES), list):
        return []
    return [[record["iter"], s.get("prompt"), s.get("text")] for s in record[SAMPLES] if isinstance(s, dict)]


def earlier_rows(records: Iterable[dict[str, Any]], before: int) -> list[list[Any]]:
    """The table's rows from the sample records of the steps before `before`: a resumed run's earlier
    sessions, as metrics.jsonl held them (MetricsLog.resume_at's KeptRecords, bounded and checked, streamed)."""
    return [row for record in records if record["iter"] < before for row in sample_rows(record)]


def build_showcase(cfg: Config, tokenizer: dict) -> Showcase:
    """The run's Showcase: the prompts encoded with the run's tokenizer (a prompt it can't encode is one
    line, before the model is built) and matplotlib present for the pictures. Off when both intervals are."""
    e = cfg.eval
    if not (e.sample_interval or e.inspect_interval):
        return Showcase()
    if e.inspect_interval and cfg.model.block_size < 2:  # one token: nothing predicted, nan bits/token
        raise UserError(f"eval.inspect_interval needs model.block_size >= 2 (got {cfg.model.block_size}): the inspected "
                        "text is one token, from which the model predicts nothing (python -m eval.inspect refuses it "
                        "too); set eval.inspect_interval=0, or a larger block_size")
    if e.inspect_interval and importlib.util.find_spec("matplotlib") is None:
        raise UserError("eval.inspect_interval draws its pictures with matplotlib, which is not installed; "
                        "pip install matplotlib, or set eval.inspect_interval=0")
    tok = tokenizer_from_meta(tokenizer)
    given = bool(e.sample_prompts)
    if cfg.data.format == "chat":  # the samples are replies to questions (eval.sample_prompts, or fixed ones)
        template = template_for(tok)
        prompts = chat_prompts(tok, template, e.sample_prompts or DEFAULT_QUESTIONS, given) if e.sample_interval else []
        return Showcase(tok=MarkedTokenizer(tok, template), prompts=prompts, tokens=e.sample_tokens,
                        seed=cfg.train.seed, template=template)
    prompts = prompt_ids(tok, e.sample_prompts or default_prompts(cfg.data.dataset), given) if e.sample_interval else []
    return Showcase(tok=tok, prompts=prompts, tokens=e.sample_tokens, seed=cfg.train.seed)


class Replay:
    """What a resumed run sends to wandb with a step it replays from metrics.jsonl (WandbLogger's `media`): the
    step's pictures still on disk (replayed_media), and, for a step that sampled, the samples table as it stood
    at that step: the rows of every record up to it, the ones wandb already had included (each record is seen,
    in step order)."""

    def __init__(self, out_dir: str | Path):
        self.out_dir, self.rows = out_dir, []

    def __call__(self, record: dict[str, Any], replayed: bool):
        """-> (images: key -> path, html: key -> text, tables: key -> (columns, rows)), empty unless `replayed`."""
        rows = sample_rows(record)
        self.rows += rows
        if not replayed:
            return {}, {}, {}
        images, html = replayed_media(self.out_dir, record)
        return images, html, ({SAMPLES: (COLUMNS, list(self.rows))} if rows else {})


def replayed_media(out_dir: str | Path, record: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """The pictures of a logged step still on disk (<out_dir>/inspect/step-N/), for wandb when it never got the
    step (a kill -9 before wandb wrote it): (images: wandb key -> path, html: key -> text); none for a step that
    drew no maps, or whose files are gone."""
    if "inspect/bits_per_token" not in record:
        return {}, {}
    folder = Path(out_dir) / INSPECT_DIR / f"step-{record['iter']}"
    images = {key: str(folder / name) for key, name in IMAGES.items() if (folder / name).is_file()}
    try:
        html = {HTML_KEY: read_at_most(folder / HTML_NAME, MAX_HTML_BYTES).decode("utf-8", "replace")}
    except (OSError, TooLarge):
        html = {}
    return images, html
