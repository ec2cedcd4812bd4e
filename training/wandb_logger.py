"""wandb logging that never crashes training.

- mode "online" without an API key (no WANDB_API_KEY, no netrc entry) falls back to "offline" with a
  one-line hint; the environment's WANDB_MODE may make the mode more private (online -> offline ->
  disabled), never less;
- any exception from wandb (at init or while logging) prints one warning line and turns logging off;
- a resumed run passes the stored run id with resume="allow", so it continues the same wandb run;
- resuming replays the steps after the last checkpoint. wandb's history is append-only (rewinding a
  run is a private preview), so the steps the interrupted process already logged are not logged again:
  each step is in the run once, online and offline. train.py passes the last of them (the last record
  of metrics.jsonl, written with every wandb log); online, wandb's own step counter is used as well.
  With a bitwise resume the replayed values are the same anyway; metrics.jsonl holds the resumed ones;
- offline, every process writes its own folder `<out_dir>/wandb/offline-run-<time>-<run id>`, and
  `wandb sync --id <run id> <those folders>` uploads them into one run in the order they started:
  that command is printed when an offline run ends.
"""
from __future__ import annotations

import netrc
import os
from typing import Any
from urllib.parse import urlparse

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


def sync_command(out_dir: str, run_id: str) -> str:
    """The command that uploads every offline folder of this run (one per process) into one run."""
    return f"wandb sync --id {run_id} {os.path.join(out_dir, 'wandb', f'offline-run-*-{run_id}*')}"


class WandbLogger:
    def __init__(self, *, mode: str, project: str, run_name: str, run_id: str, out_dir: str,
                 config: dict[str, Any], active: bool = True, printer=print, logged_through: int | None = None) -> None:
        """active=False (ranks other than 0) makes every method a no-op. logged_through: the last step
        an earlier process of this run logged; steps up to it are not logged again."""
        self.run = None
        self.run_id = run_id
        self.out_dir = out_dir
        self.logged_through = logged_through if logged_through is not None else -1
        self._print = printer
        if not active:
            self.mode = "disabled"
            return
        self.mode, hint = resolve_mode(mode)
        if hint:
            printer(hint)
        if self.mode == "disabled":
            return
        try:
            import wandb

            os.makedirs(out_dir, exist_ok=True)
            self.run = wandb.init(
                project=project, name=run_name or None, id=self.run_id, resume="allow", dir=out_dir,
                config=config, mode=self.mode, settings=wandb.Settings(console="off", silent=True),
            )
            if self.mode == "online":  # the server knows the run's history: steps below run.step are in it
                self.logged_through = max(self.logged_through, int(self.run.step) - 1)
        except Exception as e:  # wandb must never take the training run down
            self._disable(f"wandb failed to start ({short_error(e)}); continuing without wandb")

    @property
    def enabled(self) -> bool:
        return self.run is not None

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self.run is None or step <= self.logged_through:  # a replayed step, in the run already
            return
        try:
            self.run.log({k: v for k, v in metrics.items() if v is not None}, step=step)
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

