"""wandb logging that never crashes training.

- mode "online" without an API key (no WANDB_API_KEY, no netrc entry) falls back to "offline" with a
  one-line hint; the environment's WANDB_MODE may make the mode more private (online -> offline ->
  disabled), never less;
- any exception from wandb (at init or while logging) prints one warning line and turns logging off;
- a resumed run passes the stored run id with resume="allow", so it continues the same wandb run.
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
        return "offline", ("wandb: no API key found (WANDB_API_KEY or `wandb login`), logging offline; "
                           "upload later with `wandb sync <out_dir>/wandb/offline-run-*`")
    return mode, ""


class WandbLogger:
    def __init__(self, *, mode: str, project: str, run_name: str, run_id: str, out_dir: str,
                 config: dict[str, Any], active: bool = True, printer=print) -> None:
        """active=False (ranks other than 0) makes every method a no-op."""
        self.run = None
        self.run_id = run_id
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
        except Exception as e:  # wandb must never take the training run down
            self._disable(f"wandb failed to start ({short_error(e)}); continuing without wandb")

    @property
    def enabled(self) -> bool:
        return self.run is not None

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self.run is None:
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

    def _disable(self, message: str) -> None:
        self._print(f"warning: {message}")
        run, self.run = self.run, None
        if run is not None:
            try:
                run.finish(exit_code=1)
            except Exception:
                pass

