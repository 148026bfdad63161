"""A tiny indented C text builder."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class Namer:
    """Fresh C identifiers, unique within one generated source."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"


class CWriter:
    def __init__(self, indent: int = 0) -> None:
        self.lines: list[str] = []
        self.level = indent

    def line(self, s: str = "") -> None:
        self.lines.append(("  " * self.level + s) if s else "")

    def raw(self, text: str) -> None:
        for ln in text.splitlines():
            self.line(ln)

    @contextmanager
    def block(self, head: str) -> Iterator[None]:
        self.line(f"{head} {{" if head else "{")
        self.level += 1
        try:
            yield
        finally:
            self.level -= 1
            self.line("}")

    def extend(self, other: CWriter) -> None:
        for ln in other.lines:
            self.lines.append(("  " * self.level + ln) if ln else "")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"
