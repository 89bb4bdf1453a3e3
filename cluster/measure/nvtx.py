"""NVTX ranges in the project's one domain. Ranges are named
``<op>/<impl> tp=.. hidden=.. M=..`` (`` compile`` appended for the first,
untimed call) with M as the payload, so
``ncu --nvtx --nvtx-include "lamport-lab@all_reduce_norm/fused*"`` selects
the fused all_reduce_norm replays."""

from __future__ import annotations

NVTX_DOMAIN = "lamport-lab"


def range_name(op: str, impl: str, *, tp: int, hidden: int, tokens: int,
               compile: bool = False) -> str:
    return (f"{op}/{impl} tp={tp} hidden={hidden} M={tokens}"
            + (" compile" if compile else ""))


def nvtx_range(name: str, payload: int):
    """A context manager: an NVTX range in :data:`NVTX_DOMAIN`."""
    import nvtx
    return nvtx.annotate(name, domain=NVTX_DOMAIN, payload=payload)
