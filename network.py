"""An unreachable network is a one-line answer within seconds, not a minute of a library's retries.

`unreachable(url)` asks a server for any HTTP answer within a few seconds. `hub_offline_unless_reachable()`
runs before the HF hub is used (hf: datasets, HellaSwag without --data, hub model names): when the hub
does not answer, HF's libraries are put in offline mode, so they use what is cached at once or fail at
once with their (short) offline error, instead of retrying for half a minute.
"""
from __future__ import annotations

import os
import sys
import threading

from errors import short_error

PROBE_TIMEOUT_S = 3.0
_TRUE = ("1", "true", "yes", "on")


def unreachable(url: str, timeout: float = PROBE_TIMEOUT_S) -> str:
    """"" when `url` answers an HTTP request within `timeout` seconds (any status: a 401 or a 404 still
    proves the network path), else why not, in a few words. The proxy variables apply as for urllib.
    The request runs in a thread, so a resolver or a TLS handshake that hangs is bounded too."""
    import urllib.error  # here, not at the top: urllib.request brings http, email and ssl (~7 MB), which
    import urllib.request  # `python -m data.prepare` and its forked workers otherwise all carry

    result: list[str] = []

    def request() -> None:
        try:
            urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout).close()
            result.append("")
        except urllib.error.HTTPError:  # the server answered
            result.append("")
        except Exception as e:  # URLError (DNS, refused, TLS), timeouts, a malformed URL
            reason = getattr(e, "reason", e)
            if isinstance(reason, TimeoutError):  # the socket's own timeout, racing the join below: the same
                return                             # answer as the join's
            result.append(short_error(reason, 80) if isinstance(reason, BaseException) else str(reason)[:80])

    thread = threading.Thread(target=request, daemon=True)
    thread.start()
    thread.join(timeout)
    if not result:
        return f"no answer from {url} within {timeout:.0f} s"
    return f"{url}: {result[0]}" if result[0] else ""


def hub_offline_unless_reachable(say=None) -> bool:
    """Put huggingface_hub and datasets in offline mode when the HF hub (HF_ENDPOINT) doesn't answer
    within seconds; returns True when offline (already, or now). `say` gets one line when it switches."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in _TRUE or os.environ.get("HF_DATASETS_OFFLINE", "").lower() in _TRUE:
        return True
    why = unreachable(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    if not why:
        return False
    os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"
    # the libraries read the variables at import: set their copies where they are already imported
    for module, names in (("huggingface_hub.constants", ("HF_HUB_OFFLINE",)),
                          ("datasets.config", ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))):
        if module in sys.modules:
            for name in names:
                setattr(sys.modules[module], name, True)
    (say or (lambda m: print(m, file=sys.stderr, flush=True)))(
        f"note: the HF hub does not answer ({why}); using HF's offline mode (only what is cached)")
    return True
