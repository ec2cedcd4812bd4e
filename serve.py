"""An OpenAI-compatible HTTP server, with a chat page, for one checkpoint (server/: see server/cli.py).

    python serve.py --checkpoint out/sft [--host 127.0.0.1] [--port 8000]
"""
from __future__ import annotations

import errors

if __name__ == "__main__":  # before the heavy imports: Ctrl-C during start-up is one line
    errors.quiet_interrupts()

from server.cli import main  # noqa: E402

if __name__ == "__main__":
    errors.start_up_done()
    errors.run_cli(main, oom_fix="lower --slots or --max-tokens, or serve a smaller model")
