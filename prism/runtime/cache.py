"""Compiling generated C into shared objects, cached on disk.

Layout (``cache_dir()`` = ``$PRISM_CACHE_DIR``, else ``$XDG_CACHE_HOME/prism``, else ``~/.cache/prism``)::

    <cache>/so/<key[:2]>/<key>.c      the generated source (kept for inspection and error messages)
    <cache>/so/<key[:2]>/<key>.so     the shared object
    <cache>/so/<key[:2]>/<key>.json   sidecar: key, size and sha256 of the .so, compiler, flags
    <cache>/pch/<pkey>/prism_pch.h[.gch]  the precompiled system headers (gcc; see precompiled_header)

``key`` = sha256 of the source, the compiler command and flags, the compiler's version line and the
machine fingerprint (``-march=native`` code is only valid on the CPU that built it). Every file is
written to a unique temporary name and moved into place with ``os.replace``, so concurrent processes
never see a partial file; the .so is published before its sidecar. An entry whose sidecar is missing,
unreadable or does not match the .so (truncated, overwritten, stale) is rebuilt, and so is one that
fails to load.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import shlex
import subprocess
import tempfile
import threading
from dataclasses import dataclass, fields
from pathlib import Path

from prism.codegen.isa import machine_fingerprint
from prism.errors import CompileError

FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-fno-math-errno", "-std=gnu11")
COMPILE_TIMEOUT_S = 600
PCH_NAME = "prism_pch.h"


@dataclass
class CacheStats:
    """Counters of this process (tests assert on them instead of timing)."""

    hits: int = 0        # a valid entry was found on disk
    misses: int = 0      # no valid entry: compiled
    rebuilds: int = 0    # an entry existed but was corrupt, stale or failed to load
    loads: int = 0       # dlopen calls
    memo_hits: int = 0   # already loaded in this process


STATS = CacheStats()
_LOCK = threading.Lock()
_KEY_LOCKS: dict[str, threading.Lock] = {}
_LOADED: dict[str, ctypes.CDLL] = {}


def reset_stats() -> None:
    for f in fields(CacheStats):
        setattr(STATS, f.name, 0)


def cache_dir() -> Path:
    d = os.environ.get("PRISM_CACHE_DIR")
    if d:
        return Path(d)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "prism"


def compiler() -> list[str]:
    return shlex.split(os.environ.get("PRISM_CC") or os.environ.get("CC") or "cc")


@functools.cache
def _version(cc: tuple[str, ...]) -> str:
    try:
        r = subprocess.run([*cc, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise CompileError(f"cannot run the C compiler {' '.join(cc)!r} ({e}); install gcc or clang, or point "
                           "PRISM_CC at one") from None
    if r.returncode != 0:
        raise CompileError(f"{' '.join(cc)} --version failed (exit {r.returncode}): {r.stderr.strip()[:500]}")
    return (r.stdout.strip().splitlines() or [""])[0]


def compiler_version() -> str:
    return _version(tuple(compiler()))


def cache_key(source: str, cc: list[str] | None = None) -> str:
    cc = cc or compiler()
    h = hashlib.sha256()
    for part in (source, " ".join(cc), " ".join(FLAGS), _version(tuple(cc)), machine_fingerprint()):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def _paths(key: str) -> tuple[Path, Path, Path]:
    d = cache_dir() / "so" / key[:2]
    return d / f"{key}.c", d / f"{key}.so", d / f"{key}.json"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; the cache may be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _valid(key: str, so: Path, meta: Path) -> bool:
    try:
        m = json.loads(meta.read_text())
        return (m.get("key") == key and so.stat().st_size == m.get("size")
                and _sha256(so) == m.get("sha256"))
    except (OSError, ValueError):
        return False


def _compile(key: str, source: str, src: Path, so: Path, meta: Path) -> None:
    cc = compiler()
    src.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write(src, source.encode())
    fd, tmp = tempfile.mkstemp(prefix=so.name + ".", suffix=".tmp.so", dir=so.parent)
    os.close(fd)
    pch = precompiled_header()

    def run(pch: Path | None) -> tuple[list[str], subprocess.CompletedProcess]:
        cmd = [*cc, *FLAGS, *(["-include", str(pch)] if pch else []), str(src), "-o", tmp, "-lm"]
        try:
            return cmd, subprocess.run(cmd, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise CompileError(f"could not run the C compiler on {src}: {e}\ncommand: {shlex.join(cmd)}") from None
    try:
        cmd, r = run(pch)
        if r.returncode != 0 and pch is not None:
            # gcc ignores a precompiled header it cannot use, but one damaged on disk is a fatal error:
            # compile again without it, and if that works, drop the header (rebuilt by the next process)
            cmd, r = run(None)
            if r.returncode == 0:
                _drop_pch(pch)
                pch = None
        if r.returncode != 0:
            msg = (r.stderr or r.stdout).strip().splitlines()
            tail = "\n".join(msg[-40:])
            raise CompileError(f"the C compiler failed (exit {r.returncode}) on the generated source {src}\n"
                               f"command: {shlex.join(cmd)}\ncompiler output (last lines):\n{tail}")
        digest, size = _sha256(Path(tmp)), Path(tmp).stat().st_size
        os.chmod(tmp, 0o755)
        os.replace(tmp, so)
    finally:
        Path(tmp).unlink(missing_ok=True)
    info = {"key": key, "size": size, "sha256": digest, "compiler": compiler_version(), "flags": list(FLAGS),
            "command": cmd[:1], "precompiled_header": str(pch) if pch else None}
    _atomic_write(meta, json.dumps(info, indent=1).encode())


# --- precompiled system headers -----------------------------------------------------------------
# Parsing <immintrin.h> and the other system headers was 0.13 s of the 0.46 s gcc spent on a typical
# kernel (W4's flash attention at -O3, 2-core VM); with them precompiled, 0.33 s. Tuning compiles six
# candidates per new shape, so this is ~0.4 s of every new shape. The header is built once per compiler,
# flags, machine and preprocessed header text (a system-header update gives a new one), gcc only (clang
# has its own format). It changes nothing in the output: gcc uses a precompiled header only when it
# matches the compilation and parses the headers otherwise, and the generated source still includes them
# itself. ``PRISM_PCH=0`` turns it off.

@functools.cache
def _is_gcc(cc: tuple[str, ...]) -> bool:
    try:
        r = subprocess.run([*cc, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0 and "Free Software Foundation" in r.stdout and "clang" not in r.stdout.lower()


_PCH: dict[tuple, Path | None] = {}
_PCH_LOCK = threading.Lock()


def precompiled_header() -> Path | None:
    """The precompiled header to ``-include`` (its ``.gch`` beside it), built on first use; None when the
    compiler is not gcc, ``PRISM_PCH=0``, or building it failed (compiles then parse the headers)."""
    from prism.codegen.prelude import SYSTEM_HEADERS
    if os.environ.get("PRISM_PCH", "").strip() == "0":
        return None
    cc = tuple(compiler())
    memo = (str(cache_dir()), cc)
    with _PCH_LOCK:  # the tuner compiles on several threads: one builds, the others wait for it
        if memo not in _PCH:
            _PCH[memo] = _build_pch(cc, SYSTEM_HEADERS) if _is_gcc(cc) else None
        return _PCH[memo]


def _pch_flags() -> list[str]:
    return [f for f in FLAGS if f != "-shared"]


def _build_pch(cc: tuple[str, ...], text: str) -> Path | None:
    flags = _pch_flags()
    try:
        with tempfile.TemporaryDirectory(prefix="prism-pch-") as d:
            h = Path(d) / PCH_NAME
            h.write_text(text)
            r = subprocess.run([*cc, *flags, "-E", "-P", str(h)], capture_output=True, text=True, timeout=120)
            if r.returncode != 0:
                return None
        key = hashlib.sha256("\0".join([text, r.stdout, " ".join(cc), " ".join(flags), _version(cc),
                                        machine_fingerprint()]).encode()).hexdigest()[:32]
        d = cache_dir() / "pch" / key
        header, gch = d / PCH_NAME, d / (PCH_NAME + ".gch")
        if header.is_file() and gch.is_file() and header.read_text() == text:
            return header
        d.mkdir(parents=True, exist_ok=True)
        _atomic_write(header, text.encode())
        fd, tmp = tempfile.mkstemp(prefix=gch.name + ".", suffix=".tmp", dir=d)
        os.close(fd)
        try:
            r = subprocess.run([*cc, *flags, "-x", "c-header", str(header), "-o", tmp], capture_output=True,
                               text=True, timeout=COMPILE_TIMEOUT_S)
            if r.returncode != 0:
                return None
            os.chmod(tmp, 0o644)
            os.replace(tmp, gch)
        finally:
            Path(tmp).unlink(missing_ok=True)
        return header
    except (OSError, subprocess.TimeoutExpired, CompileError):
        return None


def _drop_pch(header: Path) -> None:
    Path(str(header) + ".gch").unlink(missing_ok=True)
    with _PCH_LOCK:
        for k, v in list(_PCH.items()):
            if v == header:
                _PCH[k] = None


def _key_lock(key: str) -> threading.Lock:
    with _LOCK:
        return _KEY_LOCKS.setdefault(key, threading.Lock())


def build(source: str) -> Path:
    """The path of a valid shared object for ``source`` (compiled unless a valid cache entry exists)."""
    key = cache_key(source)
    src, so, meta = _paths(key)
    with _key_lock(key):
        if _valid(key, so, meta):
            STATS.hits += 1
            return so
        if so.exists() or meta.exists():
            STATS.rebuilds += 1
        STATS.misses += 1
        _compile(key, source, src, so, meta)
        return so


def load(source: str) -> tuple[ctypes.CDLL, Path]:
    """Build (or find) and dlopen the shared object for ``source``; a file that fails to load is rebuilt."""
    key = cache_key(source)
    lib = _LOADED.get(key)
    if lib is not None:
        STATS.memo_hits += 1
        return lib, _paths(key)[1]
    so = build(source)
    try:
        STATS.loads += 1
        lib = ctypes.CDLL(str(so))
    except OSError:
        with _key_lock(key):
            STATS.rebuilds += 1
            src, so, meta = _paths(key)
            meta.unlink(missing_ok=True)
            _compile(key, source, src, so, meta)
        STATS.loads += 1
        lib = ctypes.CDLL(str(so))
    _LOADED[key] = lib
    return lib, so
