"""wandb logging that never crashes training.

- mode "online" without an API key (no WANDB_API_KEY, no netrc entry) falls back to "offline" with a
  one-line hint; the environment's WANDB_MODE may make the mode more private (online -> offline ->
  disabled), never less;
- any exception from wandb (at init or while logging) prints one warning line and turns logging off;
- a resumed run passes the stored run id with resume="allow", so it continues the same wandb run;
- each logged step reaches wandb exactly once, whatever ended the earlier process (a SIGTERM, a crash,
  kill -9). wandb's history is append-only (rewinding a run is a private preview), and wandb-core
  writes its offline file (and uploads) in batches, so a process killed hard loses the steps it had
  logged but wandb had not yet written. A resumed run therefore asks wandb what it HAS: online, the
  run's step counter on the server; offline, the last history step in the run's earlier offline folders,
  read back from their transaction logs (`last_offline_step`). Then it sends, from metrics.jsonl (which
  holds every logged step up to the checkpoint, written unbuffered), the steps wandb lacks up to the
  checkpoint (`history`), and from there on logs only the steps past what wandb has: the steps it
  replays from the checkpoint that wandb already holds are skipped (with a bitwise resume their values
  are the same anyway; metrics.jsonl holds the resumed ones);
- text and pictures (the run's samples and attention maps) go as a table (`log_table`: the
  whole table again each time, as wandb keeps only a table's last version) and as media (`log_media`);
  metrics.jsonl's copy of the samples (a list) is left out of the charts' history (`log`);
- offline, every process writes its own folder `<out_dir>/wandb/offline-run-<time>-<run id>`, and
  `wandb sync --id <run id> <those folders>` uploads them into one run in the order they started:
  that command is printed when an offline run ends.
"""
from __future__ import annotations

import glob
import netrc
import os
import struct
import sys
import threading
import time
import zlib
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator
from urllib.parse import urlparse

import network
from errors import short_error

_PRIVACY = {"online": 0, "offline": 1, "disabled": 2}


def has_api_key(env: dict[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    if env.get("WANDB_API_KEY"):
        return True
    host = urlparse(env.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    try:
        auth = netrc.netrc(env.get("NETRC") or None).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return False
    return bool(auth and auth[2])


def resolve_mode(mode: str, env: dict[str, str] | None = None) -> tuple[str, str]:
    """(the mode to use, a one-line hint or "")."""
    env = os.environ if env is None else env
    env_mode = env.get("WANDB_MODE", "").strip().lower()
    if env_mode == "dryrun":
        env_mode = "offline"
    if env_mode in _PRIVACY and _PRIVACY[env_mode] > _PRIVACY[mode]:
        return env_mode, ""
    if mode == "online" and not has_api_key(env):
        return "offline", "wandb: no API key found (WANDB_API_KEY or `wandb login`), logging offline"
    return mode, ""


# wandb's transaction log (a `.wandb` file): a 7-byte header (":W&B", 0xBEE1, version), then LevelDB-log
# framing: 32 KiB blocks of records, each a 7-byte header (CRC-32 of type + data, little-endian length,
# type: 1 full, 2 first, 3 middle, 4 last) and data; each (reassembled) record is a protobuf Record.
_LOG_HEADER, _BLOCK, _RECORD_HEADER = 7, 32768, 7


def transaction_log(path: str | os.PathLike) -> Iterator:
    """The protobuf Records of a .wandb file, up to the first torn or damaged one (where a process
    killed mid-write stopped): what wandb would upload from it. Read a 32 KiB block at a time (a record's
    fragments never cross a block's edge, only its pieces do): a long run's log is never held whole."""
    from wandb.proto import wandb_internal_pb2 as pb

    with open(path, "rb") as f:
        block = f.read(_BLOCK)
        if block[:4] != b":W&B":
            return
        pos, pending = _LOG_HEADER, b""
        while block:
            while pos + _RECORD_HEADER <= len(block):  # a block's tail too short for a header is padding
                crc, length, kind = struct.unpack("<IHB", block[pos:pos + _RECORD_HEADER])
                chunk = block[pos + _RECORD_HEADER:pos + _RECORD_HEADER + length]
                if kind not in (1, 2, 3, 4) or len(chunk) < length or zlib.crc32(bytes([kind]) + chunk) != crc:
                    return
                pos += _RECORD_HEADER + length
                pending = chunk if kind in (1, 2) else pending + chunk
                if kind in (1, 4):
                    record = pb.Record()
                    try:
                        record.ParseFromString(pending)
                    except Exception:  # the protobuf's own DecodeError: damaged data
                        return
                    yield record
            if len(block) < _BLOCK:
                return
            block, pos = f.read(_BLOCK), 0


def _open_by_any_process(paths: list[str]) -> bool:
    """Whether a process holds one of `paths` open (Linux /proc; False where it can't be told)."""
    targets = {os.path.realpath(p) for p in paths}
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return False
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in targets:
                    return True
            except OSError:
                continue
    return False


def last_offline_step(out_dir: str, run_id: str, *, wait_s: float = 60.0, printer=print) -> int:
    """The last history step that the earlier offline processes of this run wrote to their
    transaction logs (`<out_dir>/wandb/offline-run-*-<run id>*/run-<run id>.wandb`); -1 when none.

    The wandb-core of a process killed with -9 outlives it for a moment, writing what it had received:
    its file is read once no process holds it open (waiting at most `wait_s`), so that no step is
    counted missing that it is about to write."""
    paths = glob.glob(os.path.join(glob.escape(out_dir), "wandb", f"offline-run-*-{glob.escape(run_id)}*",
                                   f"run-{glob.escape(run_id)}.wandb"))
    deadline, said = time.monotonic() + wait_s, False
    while paths and _open_by_any_process(paths) and time.monotonic() < deadline:
        if not said:
            printer("wandb: waiting for the interrupted process's wandb-core to finish writing its offline files")
            said = True
        time.sleep(0.2)
    last = -1
    for path in paths:
        try:
            for record in transaction_log(path):
                if record.WhichOneof("record_type") == "history":
                    last = max(last, int(record.history.step.num))
        except OSError:
            continue
    return last


PROBE_TIMEOUT_S = network.PROBE_TIMEOUT_S  # an unreachable server is known within this, not after wandb's 90 s
INIT_TIMEOUT_S = 30.0  # a server that answers the probe but not the init
START_LIMIT_S = INIT_TIMEOUT_S + 30.0  # wandb.init as a whole, its service's start included (_bounded)


def unreachable(env: dict[str, str] | None = None, timeout: float = PROBE_TIMEOUT_S) -> str:
    """"" when wandb's server (WANDB_BASE_URL) answers within `timeout` seconds, else why not (network.py)."""
    env = os.environ if env is None else env
    return network.unreachable(env.get("WANDB_BASE_URL", "https://api.wandb.ai"), timeout)


WANDB_DIR_VARIABLES = ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR")


def unusable_dir_variable(env: dict[str, str] | None = None) -> str:
    """"" when every wandb folder variable that is set names a folder this process can create and write,
    else a one-line reason naming the variable. (wandb-core, refused its folders, prints its log lines on
    the console instead.)"""
    env = os.environ if env is None else env
    for name in WANDB_DIR_VARIABLES:
        value = env.get(name)
        if not value:
            continue
        try:
            os.makedirs(value, exist_ok=True)
            ok = os.path.isdir(value) and os.access(value, os.W_OK)
            why = "is not a writable folder"
        except OSError as e:
            ok, why = False, f"cannot be created ({e.strerror or type(e).__name__})"
        except RecursionError:  # os.makedirs recurses once per missing folder: thousands of levels exhaust it
            ok, why = False, "cannot be created (too many nested folders)"
        if not ok:
            return f"{name}={value} {why}; fix or unset {name}"
    return ""


def _bounded(fn, limit_s: float, what: str):
    """fn() in a helper thread, at most `limit_s` seconds: wandb.init can wait forever for its service (its
    own init_timeout does not cover connecting to it; seen once in 1335 tests, its asyncio thread stuck on
    the logging lock), and wandb must never hang the training run. Past the limit: TimeoutError, and the
    thread is left behind (a daemon: it does not keep the process alive)."""
    box: dict[str, Any] = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:  # handed to the caller's thread
            box["error"] = e
    thread = threading.Thread(target=run, daemon=True, name=f"{what}-start")
    thread.start()
    thread.join(limit_s)
    if thread.is_alive():
        raise TimeoutError(f"{what} did not return within {limit_s:.0f} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


@contextmanager
def _stderr_to(path: str):
    """Point file descriptor 2 at `path` for the block: wandb-core, started inside wandb.init, inherits it,
    so whatever it prints goes to its log file instead of the user's console."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0), 0o644)
    except OSError:
        os.close(saved)
        yield
        return
    try:
        os.dup2(fd, 2)
        os.close(fd)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def sync_command(out_dir: str, run_id: str) -> str:
    """The command that uploads every offline folder of this run (one per process) into one run."""
    return f"wandb sync --id {run_id} {os.path.join(out_dir, 'wandb', f'offline-run-*-{run_id}*')}"


class WandbLogger:
    def __init__(self, *, mode: str, project: str, run_name: str, run_id: str, out_dir: str,
                 config: dict[str, Any], active: bool = True, printer=print,
                 history: Iterable[dict[str, Any]] | None = None,
                 media: Callable[[dict[str, Any], bool], tuple[dict, dict, dict]] | None = None) -> None:
        """active=False (ranks other than 0) makes every method a no-op. history: when resuming, the
        records of metrics.jsonl up to the checkpoint (each with its "iter", in step order; MetricsLog.resume_at's
        KeptRecords, whose truth is whether there are any); those wandb lacks are sent first (see the module's docstring),
        with what `media(record, replayed)` gives for them (images: key -> path, html: key -> text, tables: key ->
        (columns, rows)); it sees every record, the ones wandb has too (replayed False), in order."""
        self.run = None
        self.run_id = run_id
        self.out_dir = out_dir
        self.logged_through = -1  # the last step wandb has: later calls to log() for steps up to it are skipped
        self._pending: list = []  # the parts of the step being logged (end_step sends them in one call)
        self._pending_step = -1
        self._media = media
        self._print = printer
        if not active:
            self.mode = "disabled"
            return
        self.mode, hint = resolve_mode(mode)
        if hint:
            printer(hint)
        if self.mode == "disabled":
            return
        bad_dir = unusable_dir_variable()
        if bad_dir:
            printer(f"warning: wandb: {bad_dir}; continuing without wandb")
            self.mode = "disabled"
            return
        if self.mode == "online":
            why = unreachable()
            if why:
                printer(f"wandb: cannot reach the wandb server ({why}); logging offline, upload later with the "
                        "`wandb sync` command printed at the end")
                self.mode = "offline"
        try:
            import wandb

            os.makedirs(out_dir, exist_ok=True)
            if history and self.mode == "offline":  # before init: this process's own folder is not among them
                self.logged_through = last_offline_step(out_dir, run_id, printer=printer)
            os.makedirs(os.path.join(out_dir, "wandb"), exist_ok=True)
            with _stderr_to(os.path.join(out_dir, "wandb", "wandb-core-stderr.log")):
                self.run = _bounded(lambda: wandb.init(
                    project=project, name=run_name or None, id=self.run_id, resume="allow", dir=out_dir,
                    config=config, mode=self.mode,
                    settings=wandb.Settings(console="off", silent=True, init_timeout=INIT_TIMEOUT_S),
                ), START_LIMIT_S, "wandb.init")
            if self.mode == "online":  # the server knows the run's history: steps below run.step are in it
                self.logged_through = int(self.run.step) - 1
        except Exception as e:  # wandb must never take the training run down
            self._disable(f"wandb failed to start ({short_error(e)}); continuing without wandb")
            return
        self._send_missing(history or [])

    def _send_missing(self, history: Iterable[dict[str, Any]]) -> None:
        """Log the records of metrics.jsonl that wandb lacks: those an earlier process logged but that
        never reached wandb's file or server (a hard kill). Streamed in the file's order, which is step order
        (MetricsLog.KeptRecords: a long run's records are never held at once); wandb's history only grows, so
        a record whose step is not past the last one wandb has (only in a file edited by hand) is left out."""
        sent, first = 0, None
        for record in history:
            step = record.get("iter")
            if self.run is None:  # (wandb failed on the way: logging is off)
                return
            replayed = isinstance(step, int) and step > self.logged_through
            images, html, tables = self._media(record, replayed) if self._media is not None else ({}, {}, {})
            if not replayed:
                continue
            self.log({k: v for k, v in record.items() if k != "iter"}, step)
            if images or html:  # the step's pictures, still on disk (after a kill -9 wandb had none of the step)
                self.log_media(step, images=images, html=html, values={})
            for key, (columns, rows) in tables.items():  # the samples table as it stood at the step
                self.log_table(key, columns, rows, step)
            self.end_step()
            self.logged_through, sent, first = step, sent + 1, step if first is None else first
        if sent and self.run is not None:
            self._print(f"wandb: sent {sent} logged step(s) ({first}..{self.logged_through}) "
                        "that the interrupted process had not got to wandb, from metrics.jsonl")

    @property
    def enabled(self) -> bool:
        return self.run is not None

    def log(self, metrics: dict[str, Any], step: int) -> None:
        """The numbers of `metrics` at `step`; lists and dicts (metrics.jsonl's samples) are not charted."""
        self._log(lambda wandb: {k: v for k, v in metrics.items() if v is not None and not isinstance(v, (list, dict))},
                  step)

    def log_table(self, key: str, columns: list[str], rows: list[list[Any]], step: int) -> None:
        """The table `rows` (every row so far: wandb shows a table's last version) under `key` at `step`."""
        self._log(lambda wandb: {key: wandb.Table(columns=columns, data=rows)}, step)

    def log_media(self, step: int, *, images: dict[str, str], html: dict[str, str], values: dict[str, float]) -> None:
        """PNG files (key -> path), HTML pages (key -> text) and numbers, at `step`."""
        self._log(lambda wandb: {k: wandb.Image(path) for k, path in images.items()}
                  | {k: wandb.Html(text) for k, text in html.items()} | values, step)

    def _log(self, payload, step: int) -> None:
        """payload(the wandb module) kept for `step`, sent with the step's other parts by end_step: a stop in the
        middle of a step (a signal during its eval) sends none of it, where wandb committed the parts logged so
        far and the resumed run, finding the step in wandb, never sent the rest. Nothing for a replayed step,
        which the run has already."""
        if self.run is None or step <= self.logged_through:
            return
        if self._pending and self._pending_step != step:
            self.end_step()
        self._pending.append(payload)
        self._pending_step = step

    def end_step(self) -> None:
        """run.log of everything the step logged, in one call (the loop calls it once a step is whole, with its
        metrics.jsonl record); wandb's failure turns logging off, never the run."""
        pending, self._pending = self._pending, []
        if self.run is None or not pending:
            return
        try:
            import wandb

            data: dict[str, Any] = {}
            for payload in pending:
                data |= payload(wandb)
            if data:
                self.run.log(data, step=self._pending_step)
        except Exception as e:
            self._disable(f"wandb.log failed ({short_error(e)}); continuing without wandb")

    def summary(self, values: dict[str, Any]) -> None:
        if self.run is None:
            return
        try:
            for k, v in values.items():
                self.run.summary[k] = v
        except Exception as e:
            self._disable(f"wandb summary failed ({short_error(e)}); continuing without wandb")

    def finish(self, exit_code: int = 0) -> None:
        if self.run is None:
            return
        run, self.run = self.run, None
        try:
            run.finish(exit_code=exit_code)
        except Exception as e:
            self._print(f"warning: wandb finish failed ({short_error(e)})")
        if self.mode == "offline":
            self._print(f"wandb: this run is offline; upload it (every resumed part) with: "
                        f"{sync_command(self.out_dir, self.run_id)}")

    def _disable(self, message: str) -> None:
        self._print(f"warning: {message}")
        run, self.run = self.run, None
        if run is not None:
            try:
                run.finish(exit_code=1)
            except Exception:
                pass
            try:  # now, not at exit: wandb's atexit hook would meet the same dead wandb-core with ~30 lines of
                import wandb  # traceback (found from outside: wandb-core killed mid-run); its teardown
                wandb.teardown(exit_code=1)  # unregisters that hook before it fails
            except Exception:
                pass

