"""One test module's leftovers never reach the next (a pytest plugin, loaded
by tests/conftest.py).

A module that starts Ray or a torch.distributed process group cleans up in
its own fixtures, but a failing test or fixture can skip that cleanup: a
default process group still initialised makes the next module's
``init_process_group`` raise ("trying to initialize the default process
group twice"), a Ray session still open is silently reused by the next
module's ``ray.init`` guard, and environment variables a run set
(``MASTER_ADDR``/``MASTER_PORT`` of a lone NCCL group, Ray's auth
variables) reach every process started after it. The module-scoped
autouse fixture :func:`isolated_module` snapshots the environment before a
module and, after it, destroys a process group and shuts a Ray session the
module left, and restores the environment; each cleanup it had to do is a
:class:`LeftoverWarning` naming the module (in pytest's warnings summary),
so the leak itself gets fixed too.
"""

from __future__ import annotations

import os
import sys
import warnings

import pytest

IGNORED_ENV = ("PYTEST_CURRENT_TEST",)
"""Variables pytest itself sets and clears around each test."""
QUIET_ENV = ("RAY_", "PYTHONBREAKPOINT")
"""Prefixes of variables ``ray.init`` sets in the driver: restored without a
warning (every module that starts Ray leaves them)."""


class LeftoverWarning(UserWarning):
    """A test module left a process group, a Ray session or changed
    environment variables behind (undone by :func:`isolated_module`)."""


def open_process_group() -> bool:
    """Whether this process has a default torch.distributed group (False
    where torch or its distributed package is absent)."""
    dist = sys.modules.get("torch.distributed")
    return bool(dist is not None and dist.is_available() and dist.is_initialized())


def open_ray_session() -> bool:
    ray = sys.modules.get("ray")
    return bool(ray is not None and ray.is_initialized())


def restore_environment(saved: dict[str, str]) -> list[str]:
    """Make ``os.environ`` equal ``saved`` again; the names that differed."""
    changed = sorted(k for k in set(os.environ) | set(saved)
                     if os.environ.get(k) != saved.get(k) and k not in IGNORED_ENV)
    for k in changed:
        if k in saved:
            os.environ[k] = saved[k]
        else:
            del os.environ[k]
    return changed


def clean_up_after(module: str, saved_env: dict[str, str]) -> list[str]:
    """Undo what ``module`` left (process group, Ray session, environment);
    returns one line per thing undone."""
    done = []
    if open_process_group():
        import torch.distributed as dist
        dist.destroy_process_group()
        done.append("destroyed the default torch.distributed process group it left")
    if open_ray_session():
        import ray
        ray.shutdown()
        done.append("shut down the Ray session it left")
    changed = [k for k in restore_environment(saved_env) if not k.startswith(QUIET_ENV)]
    if changed:
        done.append(f"restored the environment variables {changed}")
    return [f"{module}: {line}" for line in done]


@pytest.fixture(scope="module", autouse=True)
def isolated_module(request):
    saved = dict(os.environ)
    yield
    for line in clean_up_after(request.module.__name__, saved):
        warnings.warn(line, LeftoverWarning, stacklevel=1)
