"""Checksummed JSON files written atomically: the tuner's disk cache.

Layout (``root()`` = ``$PRISM_CACHE_DIR/tune``, else ``$XDG_CACHE_HOME/prism/tune``, else
``~/.cache/prism/tune``)::

    tune/machine/<fingerprint>-t<threads>.json      measured bandwidth and peak FLOP/s
    tune/results/<program key>/<key>.json           one tuning result (program, shapes, machine, threads)

Every file is ``{"format": FORMAT, "kind": ..., "sha256": <of the payload>, "payload": {...}}``, written to
a unique temporary name and published with ``os.replace`` (readers never see a partial file). A file
that does not parse, has another format or kind, or whose checksum does not match is *corrupt*:
``load`` reports it and the caller rebuilds the entry (counted in ``STATS.rebuilds``).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prism.runtime.cache import cache_dir

FORMAT = "prism-tune/1"


def root() -> Path:
    return cache_dir() / "tune"


def digest(material: Any) -> str:
    """A stable hash of JSON-able ``material`` (sorted keys)."""
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()


@dataclass(frozen=True)
class Loaded:
    payload: dict[str, Any] | None   # None: missing or corrupt
    corrupt: bool = False
    why: str = ""


def load(path: Path, kind: str) -> Loaded:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return Loaded(None)
    except OSError as e:
        return Loaded(None, True, f"unreadable: {e}")
    try:
        d = json.loads(text)
    except ValueError as e:
        return Loaded(None, True, f"not JSON: {e}")
    if not isinstance(d, dict) or d.get("format") != FORMAT or d.get("kind") != kind:
        return Loaded(None, True, f"not a {kind!r} entry of format {FORMAT}")
    payload = d.get("payload")
    if not isinstance(payload, dict) or digest(payload) != d.get("sha256"):
        return Loaded(None, True, "checksum mismatch")
    return Loaded(payload)


def save(path: Path, kind: str, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps({"format": FORMAT, "kind": kind, "sha256": digest(payload), "payload": payload}, indent=1,
                      sort_keys=True, default=str)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
