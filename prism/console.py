"""Rich consoles for the command line and progress output.

On a terminal a console takes the terminal's width. Piped or logged (``prism bench > out.txt``, CI logs),
rich would assume 80 columns and squeeze every table into columns of ``…``; there the width is
``PIPE_WIDTH``, which fits the widest table Prism prints, and a table is still rendered at its natural
width (no padding). ``COLUMNS`` set in the environment wins, as rich's own rule.
"""

from __future__ import annotations

import os
import sys
from typing import Any

PIPE_WIDTH = 400


def console(stderr: bool = False) -> Any:
    """A ``rich.console.Console`` on stdout (or stderr) with the width rule above."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    tty = hasattr(stream, "isatty") and stream.isatty()
    width = None if tty or os.environ.get("COLUMNS") else PIPE_WIDTH
    return Console(stderr=stderr, width=width)
