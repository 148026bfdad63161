"""Checksummed JSON entries written atomically: the search's, the tuner's and the machine's disk caches.

Layout (``cache_dir()`` = ``$PRISM_CACHE_DIR``, else ``$XDG_CACHE_HOME/prism``, else ``~/.cache/prism``)::

    search/<key>.json                             one search result (program, limits, env, verifier)
    tune/machine/<fingerprint>-t<threads>.json    measured bandwidth and peak FLOP/s
    tune/results/<program key>/<key>.json         one tuning result (program, shapes, machine, threads)

Every file is ``{"format": FORMAT, "kind": ..., "sha256": <of the payload>, "payload": {...}}``, published
with :func:`prism.runtime.cache.atomic_write` (readers never see a partial file; a read-only cache
directory falls back to a private temporary one). A file that cannot be read or decoded, does not parse,
has another format or kind, or whose checksum does not match is *corrupt*: ``load`` reports it (with one
:class:`~prism.errors.CacheWarning`) and the caller rebuilds the entry (counted in ``STATS.rebuilds``).
"""

from __future__ import annotations

import hashlib
import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prism.errors import CacheWarning
from prism.runtime.cache import atomic_write, cache_dir, readable

FORMAT = "prism-tune/1"   # the envelope's name predates the search cache using it; kept so caches stay valid


def root() -> Path:
    """The tuner's part of the cache."""
    return cache_dir() / "tune"


def digest(material: Any) -> str:
    """A stable hash of JSON-able ``material`` (sorted keys)."""
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()


@dataclass(frozen=True)
class Loaded:
    payload: dict[str, Any] | None   # None: missing or corrupt
    corrupt: bool = False
    why: str = ""


def corrupt(path: Path, kind: str, why: str) -> Loaded:
    """A corrupt entry: warn once (it will be rebuilt) and say why."""
    warnings.warn(f"{kind} cache entry {path} is corrupt ({why}); rebuilding it", CacheWarning, stacklevel=3)
    return Loaded(None, True, why)


def load(path: Path, kind: str) -> Loaded:
    path = readable(path)
    try:
        raw = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return Loaded(None)
    except OSError as e:
        return corrupt(path, kind, f"unreadable: {e}")
    try:
        d = json.loads(raw.decode("utf-8"))
    except ValueError as e:  # UnicodeDecodeError is a ValueError too
        return corrupt(path, kind, f"not UTF-8 JSON: {e}")
    if not isinstance(d, dict) or d.get("format") != FORMAT or d.get("kind") != kind:
        return corrupt(path, kind, f"not a {kind!r} entry of format {FORMAT}")
    payload = d.get("payload")
    if not isinstance(payload, dict) or digest(payload) != d.get("sha256"):
        return corrupt(path, kind, "checksum mismatch")
    return Loaded(payload)


def save(path: Path, kind: str, payload: dict[str, Any]) -> Path:
    """Write the entry; returns where it went (``path``, or its stand-in when the cache is read-only)."""
    data = json.dumps({"format": FORMAT, "kind": kind, "sha256": digest(payload), "payload": payload}, indent=1,
                      sort_keys=True, default=str)
    return atomic_write(path, data.encode())
