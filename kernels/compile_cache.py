"""The persistent compile cache: compiled CuTe DSL kernels on disk, shared by
every process of a node (every job, every rank actor).

Key: sha256 of what determines the binary -- the compile function's name and
source, the source files of the ``kernels`` modules the kernel is built from
(the compile function's imports and, transitively, each module's top-level
``kernels`` imports), the frozen config (every field), the target arch
(``config.arch``, else ``CUTE_DSL_ARCH``, else the current device's), the
compile-affecting ``CUTE_DSL_*`` variables and the CuTe DSL version. An
edit to any of these is a new key: a stale binary is never loaded.

Entry: ``<root>/<key[:2]>/<key>/`` holding ``kernel.o`` and ``kernel.h``
(the DSL's supported serialization, ``JitCompiledFunction.export_to_c``;
loaded back with ``cutlass.cute.runtime.load_module``), ``kernel.ptx`` and
``kernel.cubin`` (for compile-check's PTX checks and register counts) and
``meta.json``. An entry is built in a
private temporary folder under the root and renamed into place, so readers
see a whole entry or none and concurrent writers are safe (the first rename
wins; the others drop their copy).

What a hit still does: ``import cutlass`` (once per process), the key
(source hashes once per process), and loading the object (JIT-linking the
host stub, a few ms; the cubin inside is loaded onto the GPU at the first
call, as for a fresh compile). It does not trace the Python kernel, run
the MLIR pipeline or ptxas.

Root: ``LAMPORT_COMPILE_CACHE`` (``off`` disables the cache), else
``$XDG_CACHE_HOME/lamport-lab/compile``, else ``~/.cache/lamport-lab/compile``.
Clear it by deleting that folder.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import hashlib
import inspect
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

ENV = "LAMPORT_COMPILE_CACHE"
OBJECT, HEADER, META = "kernel.o", "kernel.h", "meta.json"
PTX, CUBIN = "kernel.ptx", "kernel.cubin"
_IGNORED_DSL_ENV = ("CUTE_DSL_CACHE_DIR", "CUTE_DSL_DUMP_DIR", "CUTE_DSL_KEEP",
                    "CUTE_DSL_LOG", "CUTE_DSL_NO_CACHE", "CUTE_DSL_DISABLE_FILE_CACHING",
                    "CUTE_DSL_JIT_CACHE_MAX_ELEMS", "CUTE_DSL_PRINT", "CUTE_DSL_FILTER_STACKTRACE",
                    "CUTE_DSL_SHOW_STACKTRACE")
"""``CUTE_DSL_*`` prefixes that do not change the binary (left out of the key)."""

stats: Counter[str] = Counter()
"""This process's ``compiled`` (misses) and ``loaded`` (hits) counts."""
_lock = threading.Lock()
_refresh = False


def cache_root() -> Path | None:
    """The cache folder, or None when ``LAMPORT_COMPILE_CACHE=off``."""
    value = os.environ.get(ENV, "").strip()
    if value.lower() == "off":
        return None
    if value:
        return Path(value).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "lamport-lab" / "compile"


def unusable(root: Path | None = None) -> str | None:
    """Why the cache folder ``root`` (default :func:`cache_root`) cannot be
    used, or None when it can (or the cache is off): it, or the nearest
    part of it that exists, is not a directory this process can list and
    create entries in. Looks only (``os.access``, ``stat``); creates nothing."""
    root = cache_root() if root is None else Path(root)
    if root is None:
        return None
    existing = root
    try:
        while not existing.exists():
            if existing.is_symlink():
                return f"{existing} is a broken symbolic link"
            if existing == existing.parent:
                break
            existing = existing.parent
        if not existing.is_dir():
            return f"{existing} exists and is not a directory"
    except OSError as err:  # a name too long, a part that cannot be looked at
        return f"cannot look at {existing} ({err.strerror or err})"
    need = os.W_OK | os.X_OK | (os.R_OK if existing == root else 0)
    if not os.access(existing, need):
        return f"{existing} is not a directory this user can write in (or it is read-only)"
    return None


@contextlib.contextmanager
def refreshing():
    """Within: every compile through :func:`persistent` runs and replaces
    its entry (``compile-check --all``)."""
    global _refresh
    old, _refresh = _refresh, True
    try:
        yield
    finally:
        _refresh = old


# ------------------------------------------------------------------ the key
_ROOT = Path(__file__).resolve().parent.parent


def _module_file(name: str) -> Path | None:
    """The source file of project module ``name`` (no import), or None."""
    base = _ROOT.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _imports(tree: ast.AST, package: str, *, top_level_only: bool) -> set[str]:
    """``kernels.*`` modules imported in ``tree`` (resolving relative imports
    against ``package``; ``from X import name`` counts X.name where it is a
    module)."""
    nodes = tree.body if top_level_only and isinstance(tree, ast.Module) else list(ast.walk(tree))
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return {m for m in found if m.split(".")[0] == "kernels" and _module_file(m) is not None}


@functools.lru_cache(maxsize=None)
def _module_closure(name: str) -> tuple[str, ...]:
    """``name`` and every ``kernels`` module its top level imports, transitively."""
    seen, todo = set(), [name]
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        seen.add(mod)
        path = _module_file(mod)
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        todo.extend(_imports(ast.parse(path.read_text()), package, top_level_only=True) - seen)
    return tuple(sorted(seen))


@functools.lru_cache(maxsize=None)
def source_digest(fn) -> tuple[str, tuple[str, ...]]:
    """(sha256 over the compile function's source and the files of the
    modules it is built from, those module names)."""
    module = fn.__module__
    source = inspect.getsource(fn)
    package = module.rpartition(".")[0] if not module.endswith("__init__") else module
    roots = {module} | _imports(ast.parse(source.lstrip()), package, top_level_only=False)
    modules = sorted({m for r in roots for m in _module_closure(r)})
    h = hashlib.sha256(f"{fn.__qualname__}\n{source}".encode())
    for m in modules:
        h.update(f"\n--{m}\n".encode())
        h.update(_module_file(m).read_bytes())
    return h.hexdigest(), tuple(modules)


@functools.lru_cache(maxsize=1)
def dsl_version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("nvidia-cutlass-dsl")
    except PackageNotFoundError:
        import cutlass
        return getattr(cutlass, "__version__", "unknown")


def resolve_arch(arch: str) -> str:
    """``arch``, else ``CUTE_DSL_ARCH``, else the current device's (what the
    DSL itself would compile for)."""
    if arch:
        return arch
    if os.environ.get("CUTE_DSL_ARCH"):
        return os.environ["CUTE_DSL_ARCH"]
    from cutlass.base_dsl.env_manager import detect_gpu_arch
    return detect_gpu_arch("CUTE_DSL")


def cache_key(fn, config) -> tuple[str, dict]:
    """(hex key, the facts it hashes) for ``fn(config)``."""
    digest, modules = source_digest(fn)
    env = {k: v for k, v in sorted(os.environ.items())
           if k.startswith("CUTE_DSL_") and k != "CUTE_DSL_ARCH"
           and not k.startswith(_IGNORED_DSL_ENV)}
    # The arch is keyed resolved, not as the config spells it: "" on the GPU
    # machine and "sm_90a" (the compile check's) build the same binary.
    fields = {k: v for k, v in dataclasses.asdict(config).items() if k != "arch"}
    facts = {"compiler": f"{fn.__module__}.{fn.__qualname__}",
             "config": f"{type(config).__qualname__}{fields!r}",
             "arch": resolve_arch(getattr(config, "arch", "")), "dsl": dsl_version(),
             "source": digest, "modules": list(modules), "env": env,
             "python": f"{sys.version_info.major}.{sys.version_info.minor}"}
    key = hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()
    return key, facts


# ------------------------------------------------------------------ entries
def entry_dir(root: Path, key: str) -> Path:
    return root / key[:2] / key


def _prefix(key: str) -> str:
    return f"lamport_{key[:24]}"


def _load(entry: Path, key: str):
    from cutlass.cute.runtime import load_module
    return load_module(str(entry / OBJECT))[_prefix(key)]


@functools.lru_cache(maxsize=1)
def _load_runtime() -> None:
    """Load the DSL's runtime library into the process (global symbols):
    ``export_to_c`` links the host stub against it, and a cross-arch compile
    (e.g. sm_100a on a machine whose DSL arch is sm_90a, or no GPU) builds
    no JIT engine that would have loaded it."""
    import ctypes

    from cutlass.runtime import find_runtime_libraries
    for path in find_runtime_libraries(enable_tvm_ffi=False):
        if os.path.exists(path):
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)


def _store(root: Path, key: str, compiled, ptx_dir: str, facts: dict, seconds: float) -> Path:
    """Write the entry under a temporary name and rename it into place."""
    _load_runtime()
    final = entry_dir(root, key)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    try:
        compiled.export_to_c(str(tmp), "kernel", function_prefix=_prefix(key))
        for pattern, name in (("*.ptx", PTX), ("*.cubin", CUBIN)):
            kept = sorted(Path(ptx_dir).glob(pattern))
            if kept:
                shutil.copyfile(kept[0], tmp / name)
        (tmp / META).write_text(json.dumps({**facts, "key": key, "compile_s": round(seconds, 4),
                                            "created": time.time(), "pid": os.getpid()},
                                           indent=1))
        if _refresh and final.exists():
            old = root / f".old-{uuid.uuid4().hex[:8]}"
            with contextlib.suppress(OSError):
                os.rename(final, old)
                shutil.rmtree(old, ignore_errors=True)
        try:
            os.rename(tmp, final)
        except OSError:  # another process stored the same key first: keep theirs
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def persistent(fn):
    """Decorator for ``compile_x(config, *, dump_dir=None)``: serve the
    compiled kernel from the cache (copying its PTX and cubin into
    ``dump_dir`` when given), else compile (keeping both), store and return
    it. A corrupt
    or unloadable entry is compiled again and replaced."""
    @functools.wraps(fn)
    def wrapper(config, *, dump_dir: str | None = None):
        root = cache_root()
        if root is None:
            with _lock:
                stats["compiled"] += 1
            return fn(config, dump_dir=dump_dir)
        key, facts = cache_key(fn, config)
        entry = entry_dir(root, key)
        if not _refresh and (entry / META).exists():
            try:
                compiled = _load(entry, key)
            except Exception:  # unreadable entry: rebuild it below
                shutil.rmtree(entry, ignore_errors=True)
            else:
                if dump_dir:
                    os.makedirs(dump_dir, exist_ok=True)
                    for name in (PTX, CUBIN):
                        if (entry / name).exists():
                            shutil.copyfile(entry / name, os.path.join(dump_dir, name))
                with _lock:
                    stats["loaded"] += 1
                return compiled
        with contextlib.ExitStack() as stack:
            ptx_dir = dump_dir or stack.enter_context(
                tempfile.TemporaryDirectory(prefix="lamport-ptx-"))
            t0 = time.perf_counter()
            compiled = fn(config, dump_dir=ptx_dir)
            seconds = time.perf_counter() - t0
            _store(root, key, compiled, ptx_dir, facts, seconds)
        with _lock:
            stats["compiled"] += 1
        return compiled
    wrapper.uncached = fn
    return wrapper


def entries(root: Path | None = None) -> int:
    """How many entries the cache holds (0 when it is off or absent)."""
    root = root or cache_root()
    if root is None or not root.exists():
        return 0
    return sum(1 for _ in root.glob(f"??/*/{META}"))
