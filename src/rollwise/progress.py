"""How progress is shown (no heavy imports: the CLI asks before transformers is imported)."""

from __future__ import annotations

import os
import sys


def plain() -> bool:
    """Plain lines, not progress bars: stdout is not a terminal (nohup, cluster jobs, pipes) or
    ``ROLLWISE_PROGRESS=plain``. A run then logs one line per step (``session.Run._bar``), and the CLI
    turns transformers' own bars off (``cli.main``)."""
    return os.environ.get("ROLLWISE_PROGRESS") == "plain" or not sys.stdout.isatty()
