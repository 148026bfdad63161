"""The `prism` command line."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    print("prism: command line under construction", file=sys.stderr)
    return 2
