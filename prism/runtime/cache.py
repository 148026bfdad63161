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
fails to load or lacks the entry points.

Every cache of Prism (kernels, precompiled headers, search, tuning, machine) writes through
:func:`make_tmp`/:func:`atomic_write` and reads through :func:`readable`, which give two guarantees:

* **No writable cache is needed.** When the cache directory cannot be written (read-only, full, not a
  directory), the write goes to the same relative path under a private temporary directory of this
  process, removed at exit, with one :class:`~prism.errors.CacheWarning` naming both places and the fix
  (``PRISM_CACHE_DIR``). Reads look there first, then in the cache directory, so entries already in a
  read-only cache are still served.
* **No stale temporary files.** A temporary file is named ``<entry>.<host>-<pid>.<random>.tmp``; the first
  write of a process into a cache directory removes the temporary files of dead processes of this host
  (a ``kill -9`` during a compile or a save) and any older than a day.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import hashlib
import json
import logging
import os
import re
import shlex
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, fields
from pathlib import Path

from prism.codegen.isa import machine_fingerprint
from prism.errors import CacheError, CacheWarning, CompileError, PrismError

FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-fno-math-errno", "-fno-trapping-math", "-std=gnu11")
COMPILE_TIMEOUT_S = 600     # default of PRISM_CC_TIMEOUT
COMPILE_PROGRESS_S = 10.0   # a compile running longer than this prints a progress line (then every 30 s)
PCH_NAME = "prism_pch.h"
STALE_TMP_S = 24 * 3600     # a temporary file older than this is stale whoever wrote it
LOG = logging.getLogger("prism")


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


# --- writing into the cache: unwritable directories, stale temporary files ----------------------------

_FALLBACK: dict[str, Path] = {}   # cache dir -> this process's temporary stand-in for writes
_CLEANED: set[str] = set()        # cache dirs whose stale temporary files this process removed
_HOST = re.sub(r"[^A-Za-z0-9]", "_", socket.gethostname())[:40] or "host"
_TMP_RE = re.compile(r"\.(?P<host>[A-Za-z0-9_]+)-(?P<pid>\d+)\.[^.]+\.tmp")


def fallback_dir() -> Path | None:
    """This process's stand-in for the cache directory, once a write there failed (else None)."""
    return _FALLBACK.get(str(cache_dir()))


def _mirror(path: Path) -> Path | None:
    fb = fallback_dir()
    if fb is None:
        return None
    try:
        return fb / path.relative_to(cache_dir())
    except ValueError:
        return None


def readable(path: Path) -> Path:
    """Where to read the cache entry ``path``: its copy written by this process under the fallback
    directory if there is one, else ``path`` itself."""
    m = _mirror(path)
    return m if m is not None and m.exists() else path


def _use_fallback(err: OSError, where: Path) -> Path:
    root = cache_dir()
    with _LOCK:
        fb = _FALLBACK.get(str(root))
        if fb is None:
            try:
                fb = Path(tempfile.mkdtemp(prefix="prism-cache-"))
            except OSError as e:
                raise CacheError(f"cannot write Prism's cache under {root} ({err}) nor in a temporary directory "
                                 f"({e}); set PRISM_CACHE_DIR to a writable directory") from None
            atexit.register(shutil.rmtree, fb, True)
            _FALLBACK[str(root)] = fb
            warnings.warn(f"Prism cannot write its cache directory {root} ({err.strerror or err} at {where}); this "
                          f"process keeps new cache entries in {fb}, removed at exit, so the next process "
                          "searches, tunes and compiles them again. Set PRISM_CACHE_DIR to a writable "
                          "directory to keep them.", CacheWarning, stacklevel=3)
        return fb


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True   # exists, owned by someone else
    return True


def remove_stale_tmp(root: Path, now: float | None = None) -> int:
    """Delete the temporary files under ``root`` left by dead processes of this host (or older than
    ``STALE_TMP_S``); returns how many. Files of live processes are kept: they are being written."""
    now = time.time() if now is None else now
    removed = 0
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            if ".tmp" not in f:
                continue
            p = Path(dirpath) / f
            m = _TMP_RE.search(f)
            try:
                old = now - p.stat().st_mtime > STALE_TMP_S
                dead = m is not None and m["host"] == _HOST and not _pid_alive(int(m["pid"]))
                if old or dead:
                    p.unlink()
                    removed += 1
            except OSError:
                continue
    return removed


def _clean_once() -> None:
    root = cache_dir()
    with _LOCK:
        if str(root) in _CLEANED:
            return
        _CLEANED.add(str(root))
    if root.is_dir():
        remove_stale_tmp(root)


def make_tmp(directory: Path, name: str, suffix: str = ".tmp") -> tuple[int, Path]:
    """A new temporary file (fd, path) for publishing ``directory/name`` atomically with ``os.replace``:
    in ``directory``, or in its mirror under the fallback directory when ``directory`` cannot be written.
    Publish it in the temporary file's own directory."""
    _clean_once()
    prefix = f"{name}.{_HOST}-{os.getpid()}."
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=directory)
        return fd, Path(tmp)
    except OSError as e:
        if not directory.is_relative_to(cache_dir()):   # already the fallback, or outside the cache: no other place
            raise CacheError(f"cannot write {directory / name}: {e}; set PRISM_CACHE_DIR to a writable "
                             "directory") from None
        _use_fallback(e, directory)
        alt = _mirror(directory)
        assert alt is not None
        alt.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=alt)
        return fd, Path(tmp)


def atomic_write(path: Path, data: bytes) -> Path:
    """Publish ``data`` as ``path`` (readers never see a partial file); returns where it was written
    (``path``, or its mirror under the fallback directory when the cache directory is not writable)."""
    fd, tmp = make_tmp(path.parent, path.name)
    target = tmp.parent / path.name
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; the cache may be shared
        os.replace(tmp, target)
    except OSError as e:  # a full disk while writing, a rename refused
        tmp.unlink(missing_ok=True)
        if target != path or not path.is_relative_to(cache_dir()):
            raise CacheError(f"cannot write {target}: {e}; set PRISM_CACHE_DIR to a writable directory") from None
        _use_fallback(e, path.parent)
        return atomic_write(path, data)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target


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


def _valid(key: str, so: Path, meta: Path) -> bool:
    try:
        m = json.loads(meta.read_bytes())
        return (isinstance(m, dict) and m.get("key") == key and so.stat().st_size == m.get("size")
                and _sha256(so) == m.get("sha256"))
    except (OSError, ValueError):  # ValueError: undecodable bytes or not JSON
        return False


def compile_timeout() -> float:
    """Seconds one compile may take: ``PRISM_CC_TIMEOUT`` (default ``COMPILE_TIMEOUT_S``)."""
    raw = os.environ.get("PRISM_CC_TIMEOUT", "").strip()
    if not raw:
        return float(COMPILE_TIMEOUT_S)
    try:
        v = float(raw)
    except ValueError:
        raise CompileError(f"PRISM_CC_TIMEOUT must be a number of seconds, got {raw!r}") from None
    if not v > 0:
        raise CompileError(f"PRISM_CC_TIMEOUT must be > 0 seconds, got {raw!r}")
    return v


def run_compiler(cmd: list[str], what: str) -> subprocess.CompletedProcess:
    """Run one compiler command with the ``PRISM_CC_TIMEOUT`` limit, logging a progress line (logger
    ``prism``) when it runs longer than ``COMPILE_PROGRESS_S``. A hung compiler is killed."""
    limit = compile_timeout()
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except OSError as e:
        raise CompileError(f"could not run the C compiler for {what}: {e}\ncommand: {shlex.join(cmd)}; install "
                           "gcc or clang, or point PRISM_CC at one") from None
    next_note = COMPILE_PROGRESS_S
    while True:
        elapsed = time.monotonic() - t0
        try:
            out, err = proc.communicate(timeout=max(0.01, min(next_note, limit) - elapsed))
            return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
        except subprocess.TimeoutExpired:
            elapsed = time.monotonic() - t0
            if elapsed >= limit:
                proc.kill()
                proc.communicate()
                raise CompileError(f"the C compiler did not finish {what} within {limit:g} s and was stopped\n"
                                   f"command: {shlex.join(cmd)}\nraise the limit with PRISM_CC_TIMEOUT=<seconds>, "
                                   "or check the compiler (PRISM_CC)") from None
            LOG.warning("prism: still compiling %s after %.0f s (limit %g s, PRISM_CC_TIMEOUT)", what, elapsed, limit)
            next_note += 30.0


def _compile(key: str, source: str, src: Path, so: Path) -> Path:
    """Compile ``source`` into the entry ``so`` (or its mirror when the cache is read-only); returns the
    path of the published shared object. Its sidecar is written last."""
    cc = compiler()
    fd, tmp_path = make_tmp(so.parent, so.name, ".tmp.so")
    os.close(fd)
    tmp = str(tmp_path)
    where = tmp_path.parent
    src, so, meta = where / src.name, where / so.name, where / f"{key}.json"
    atomic_write(src, source.encode())
    pch = precompiled_header()

    def run(pch: Path | None) -> tuple[list[str], subprocess.CompletedProcess]:
        cmd = [*cc, *FLAGS, *(["-include", str(pch)] if pch else []), str(src), "-o", tmp, "-lm"]
        return cmd, run_compiler(cmd, f"the generated source {src}")
    try:
        cmd, r = run(pch)
        if r.returncode != 0 and pch is not None:
            # gcc ignores a precompiled header it cannot use, but one damaged on disk is a fatal error:
            # compile again without it, and if that works, drop the header (rebuilt by the next process)
            cmd, r = run(None)
            if r.returncode == 0:
                warnings.warn(f"the precompiled header {pch}.gch is damaged (a compile failed with it and succeeded "
                              "without); dropped, the next process builds it again", CacheWarning, stacklevel=2)
                _drop_pch(pch)
                pch = None
        if r.returncode != 0:
            msg = (r.stderr or r.stdout).strip().splitlines()
            tail = "\n".join(msg[-40:])
            raise CompileError(f"the C compiler failed (exit {r.returncode}) on the generated source {src}\n"
                               f"command: {shlex.join(cmd)}\ncompiler output (last lines):\n{tail}")
        with open(tmp, "rb") as f:
            magic = f.read(4)
        if magic != b"\x7fELF":
            raise CompileError(f"the C compiler exited 0 on {src} but wrote no shared library (its output "
                               f"{tmp} is {'empty' if not magic else 'not an ELF file'})\ncommand: {shlex.join(cmd)}"
                               "\ncheck the compiler (PRISM_CC)")
        digest, size = _sha256(Path(tmp)), Path(tmp).stat().st_size
        os.chmod(tmp, 0o755)
        os.replace(tmp, so)
    finally:
        Path(tmp).unlink(missing_ok=True)
    info = {"key": key, "size": size, "sha256": digest, "compiler": compiler_version(), "flags": list(FLAGS),
            "command": cmd[:1], "precompiled_header": str(pch) if pch else None}
    atomic_write(meta, json.dumps(info, indent=1).encode())
    return so


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
        # preprocessed from stdin: a temporary header directory was left in /tmp by every process killed
        # during this call (41 of them after a day of test runs)
        r = subprocess.run([*cc, *flags, "-E", "-P", "-x", "c", "-"], input=text, capture_output=True, text=True,
                           timeout=120)
        if r.returncode != 0:
            return None
        key = hashlib.sha256("\0".join([text, r.stdout, " ".join(cc), " ".join(flags), _version(cc),
                                        machine_fingerprint()]).encode()).hexdigest()[:32]
        d = cache_dir() / "pch" / key
        header, gch = d / PCH_NAME, d / (PCH_NAME + ".gch")
        header, gch = readable(header), readable(gch)
        check = gch.parent / (gch.name + ".sha256")   # the .gch's checksum, written after it
        if header.is_file() and gch.is_file():
            if header.read_bytes() == text.encode() and check.is_file() and check.read_bytes() == _sha256(gch).encode():
                return header
            warnings.warn(f"the precompiled header {gch} is damaged (its text or checksum does not match); "
                          "rebuilding it", CacheWarning, stacklevel=2)
        header = atomic_write(header, text.encode())
        fd, tmp_path = make_tmp(header.parent, gch.name)
        os.close(fd)
        tmp, gch = str(tmp_path), header.parent / gch.name
        try:
            r = run_compiler([*cc, *flags, "-x", "c-header", str(header), "-o", tmp], "the precompiled header")
            if r.returncode != 0:
                return None
            os.chmod(tmp, 0o644)
            digest = _sha256(Path(tmp))
            os.replace(tmp, gch)
        finally:
            Path(tmp).unlink(missing_ok=True)
        atomic_write(gch.parent / (gch.name + ".sha256"), digest.encode())
        return header
    except (OSError, ValueError, subprocess.TimeoutExpired, PrismError):
        # no precompiled header (compiles then parse the headers): never a reason to fail a compile
        return None


def _drop_pch(header: Path) -> None:
    Path(str(header) + ".gch").unlink(missing_ok=True)
    Path(str(header) + ".gch.sha256").unlink(missing_ok=True)
    with _PCH_LOCK:
        for k, v in list(_PCH.items()):
            if v == header:
                _PCH[k] = None


def _key_lock(key: str) -> threading.Lock:
    with _LOCK:
        return _KEY_LOCKS.setdefault(key, threading.Lock())


def _find(key: str) -> tuple[Path, Path, Path]:
    """The entry's paths: under the fallback directory where this process wrote it, else the cache's."""
    src, so, meta = _paths(key)
    so = readable(so)
    return so.parent / src.name, so, so.parent / meta.name


def build(source: str) -> Path:
    """The path of a valid shared object for ``source`` (compiled unless a valid cache entry exists)."""
    key = cache_key(source)
    with _key_lock(key):
        src, so, meta = _find(key)
        if _valid(key, so, meta):
            STATS.hits += 1
            return so
        if so.exists() or meta.exists():
            STATS.rebuilds += 1
            warnings.warn(f"compiled kernel {so} is damaged or stale (its sidecar does not match); rebuilding it",
                          CacheWarning, stacklevel=2)
        STATS.misses += 1
        return _compile(key, source, src, so)


def _open(so: Path, symbols: tuple[str, ...]) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(so))
    missing = [name for name in symbols if not hasattr(lib, name)]
    if missing:
        raise OSError(f"{so} has no entry point {missing}")
    return lib


def load(source: str, symbols: tuple[str, ...] = ()) -> tuple[ctypes.CDLL, Path]:
    """Build (or find) and dlopen the shared object for ``source``, which must export ``symbols``; a file
    that fails to load or lacks them is rebuilt once, then it is a :class:`CompileError`."""
    key = cache_key(source)
    lib = _LOADED.get(key)
    if lib is not None:
        STATS.memo_hits += 1
        return lib, _find(key)[1]
    so = build(source)
    try:
        STATS.loads += 1
        lib = _open(so, symbols)
    except OSError as first:
        with _key_lock(key):
            STATS.rebuilds += 1
            warnings.warn(f"compiled kernel {so} does not load ({first}); rebuilding it", CacheWarning, stacklevel=2)
            src, so, meta = _find(key)
            meta.unlink(missing_ok=True)
            so = _compile(key, source, src, so)
        STATS.loads += 1
        try:
            lib = _open(so, symbols)
        except OSError as e:
            raise CompileError(f"the shared object {so} built from {so.with_suffix('.c')} does not load: {e}\n"
                               "the C compiler (PRISM_CC) produced an unusable library; check it") from None
    _LOADED[key] = lib
    return lib, so
