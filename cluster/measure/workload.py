"""What an op hands the harness: :class:`Workload`, built on one rank by
the builder the op's declaration names (``OpSpec.workload``: ``builder(ctx,
spec)``) from a :class:`RankContext`
(who this rank is, its group) and a :class:`Spec` (the case).

Contract of a builder:
- inputs: ``sets`` rotation sets (:func:`cluster.measure.graph.rotation_sets`
  of the bytes one set occupies on this rank: inputs and outputs), this
  rank's own TP-partials seeded by ``(seed, rank)``, everything replicated
  across TP seeded by ``seed`` alone (the same on every rank);
- ``fused()`` builds the fused op and returns a :class:`Call` whose
  ``fn(i)`` runs it on set ``i`` (outputs into preallocated buffers:
  capturable);
- ``check()`` runs after ``fused().fn(0)`` and compares set 0's outputs
  with the torch reference over every rank's inputs (``ctx.gather``),
  raising AssertionError on a wrong element;
- ``baselines[name]()`` builds a baseline the same way, or raises
  :class:`Unavailable` with the reason it cannot run here;
- ``bytes_moved``: per call and rank, the collective's payload (nccl-tests'
  ``size``: M x hidden x 2 for a BF16 all-reduce) or, for a local op, the
  bytes it must read; ``bus_factor`` turns algbw into busbw
  (2 (tp - 1) / tp for an all-reduce, 1 for a local op).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

SPEC_KEYS = ("op", "hidden", "tokens", "calls", "replays", "rotate_mb", "eps", "baselines",
             "seed", "budget_ns")
"""Keys every spec carries; ``hc`` (mHC) and ``top_k`` (finalize) where the op has them."""


class Unavailable(Exception):
    """A baseline (or the fused op) cannot run here; the message says why
    (a ``skipped`` row, never a timing)."""


@dataclasses.dataclass(frozen=True)
class Spec:
    """One timed case on one rank (from the profile job's case)."""
    op: str
    hidden: int
    tokens: int
    calls: int
    replays: int
    rotate_mb: float
    eps: float
    baselines: tuple[str, ...]
    seed: int
    budget_ns: int = 0
    hc: int | None = None
    top_k: int | None = None
    transport: str = "unicast"
    mode: str = "one_shot"
    """``AllReduceNorm`` mode (``kernels.lamport.protocol.MODES``): ``owner``
    times the token-sharded variant against the ``one_shot`` kernel."""
    form: str = "auto"
    """The one-shot ``AllReduceNorm`` form (``kernels.lamport.norm_tuning.FORMS``):
    ``auto`` the form table's, any other forced."""
    min_replay_ms: float = 0.0
    """Floor on one replay's duration (:func:`cluster.measure.graph.fit_calls`),
    per implementation; 0: a graph holds max(``calls``, sets) calls."""
    min_replays: int = 0
    """Where a graph holds more than ``calls`` calls, it is replayed
    proportionally fewer times, down to this many
    (:func:`cluster.measure.graph.scaled_replays`); 0: always ``replays``."""
    plant_delay_cycles: int = 0
    """Test-only (:mod:`jobs.plant`, the detection-power script alone): SM
    cycles the fused all_reduce_norm's single kernel spins on purpose; 0: none."""

    def fields(self) -> dict[str, Any]:
        """The fields a kernel builder reads (:mod:`cluster.ops.kernel`):
        ``eps``, ``mode`` and ``form``, and ``hc`` / ``top_k`` where the spec
        has them (``OpSpec.make_params`` takes the op's own of them)."""
        out: dict[str, Any] = {"eps": self.eps, "mode": self.mode, "form": self.form}
        out.update({k: getattr(self, k) for k in ("hc", "top_k") if getattr(self, k) is not None})
        return out

    @classmethod
    def of(cls, spec: Mapping[str, Any]) -> "Spec":
        """From a plain dict (it crosses Ray); names what is missing or bad."""
        missing = [k for k in SPEC_KEYS if k not in spec]
        if missing:
            raise ValueError(f"timing spec lacks {missing}; got {sorted(spec)}")
        unknown = set(spec) - set(SPEC_KEYS) - {"hc", "top_k", "transport", "variant", "mode",
                                                 "form", "min_replay_ms", "min_replays",
                                                 "plant_delay_cycles"}
        if unknown:
            raise ValueError(f"timing spec has unknown keys {sorted(unknown)}")
        out = cls(op=str(spec["op"]), hidden=int(spec["hidden"]), tokens=int(spec["tokens"]),
                  calls=int(spec["calls"]), replays=int(spec["replays"]),
                  rotate_mb=float(spec["rotate_mb"]), eps=float(spec["eps"]),
                  baselines=tuple(spec["baselines"]), seed=int(spec["seed"]),
                  budget_ns=int(spec.get("budget_ns") or 0),
                  hc=None if spec.get("hc") is None else int(spec["hc"]),
                  top_k=None if spec.get("top_k") is None else int(spec["top_k"]),
                  transport=str(spec.get("transport") or "unicast"),
                  mode=str(spec.get("mode") or "one_shot"),
                  form=str(spec.get("form") or "auto"),
                  min_replay_ms=float(spec.get("min_replay_ms") or 0.0),
                  min_replays=int(spec.get("min_replays") or 0),
                  plant_delay_cycles=int(spec.get("plant_delay_cycles") or 0))
        if out.min_replay_ms < 0:
            raise ValueError(f"timing spec: min_replay_ms must be >= 0, got {out.min_replay_ms}")
        if out.min_replays < 0:
            raise ValueError(f"timing spec: min_replays must be >= 0, got {out.min_replays}")
        if out.plant_delay_cycles < 0 or (out.plant_delay_cycles and out.op != "all_reduce_norm"):
            raise ValueError(f"timing spec: plant_delay_cycles must be >= 0 and only for "
                             f"all_reduce_norm, got {out.plant_delay_cycles} for {out.op}")
        from kernels.lamport.protocol import MODES
        if out.mode not in MODES:
            raise ValueError(f"timing spec: mode must be one of {list(MODES)}, got {out.mode!r}")
        from kernels.lamport.norm_tuning import FORMS
        if out.form not in FORMS:
            raise ValueError(f"timing spec: form must be one of {list(FORMS)}, got {out.form!r}")
        for name in ("hidden", "tokens", "calls", "replays", "seed"):
            if getattr(out, name) < (0 if name == "seed" else 1):
                raise ValueError(f"timing spec: {name} must be >= 1, got {getattr(out, name)}")
        if not out.rotate_mb > 0 or not out.eps > 0:
            raise ValueError(f"timing spec: rotate_mb and eps must be > 0, got "
                             f"rotate_mb={out.rotate_mb} eps={out.eps}")
        return out

    def label(self, tp: int) -> str:
        return f"tp={tp} hidden={self.hidden} M={self.tokens}"


@dataclasses.dataclass
class Call:
    """A built implementation: ``fn(i)`` runs it on rotation set ``i``;
    ``extra`` goes to its row (e.g. a baseline's version and mode, the
    elements that differ from the bit-exact contract)."""
    fn: Callable[[int], object]
    extra: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Workload:
    """See the module docstring."""
    op: str
    sets: int
    set_bytes: int
    bytes_moved: int
    bus_factor: float
    fused: Callable[[], Call]
    check: Callable[[], None]
    baselines: dict[str, Callable[[], Call]]
    collective: bool = True


class RankContext:
    """One rank as the harness sees it. ``dist``: torch.distributed is set
    up with this rank's TP group as WORLD (a process-per-GPU group, also of
    one); else a lone GPU (the benchmarks), where
    ``gather`` returns ``[t]`` and the barrier is a device synchronize.
    ``mailbox``: the group's Lamport mailbox (None: a kernel makes its own
    tp=1 mailbox). ``cache``: per-group objects built once (a baseline's
    workspace), dropped with the group."""

    def __init__(self, *, rank: int, tp: int, device, capacity: int, dist: bool,
                 mailbox=None, transport: str = "unicast", cache: dict | None = None) -> None:
        if not 0 <= rank < tp:
            raise ValueError(f"rank must be in 0..{tp - 1}, got {rank}")
        if tp > 1 and not dist:
            raise ValueError(f"tp={tp} needs a torch.distributed group (dist=True)")
        self.rank, self.tp, self.device, self.capacity = rank, tp, device, int(capacity)
        self.dist, self.mailbox, self.transport = dist, mailbox, transport
        self.cache = {} if cache is None else cache

    def barrier(self) -> None:
        """Every rank here (NCCL barrier), then this device idle."""
        import torch
        if self.dist:
            import torch.distributed as dist
            dist.barrier(device_ids=[self.device.index])
        torch.cuda.synchronize(self.device)

    def gather(self, t) -> list:
        """Every rank's ``t`` (same shape and dtype on each), rank order."""
        if not self.dist:
            return [t]
        import torch
        import torch.distributed as dist
        out = [torch.empty_like(t) for _ in range(self.tp)]
        dist.all_gather(out, t.contiguous())
        return out

    def failed_elsewhere(self, failed: bool) -> int:
        """How many ranks report ``failed`` (this one included): every rank
        calls it at the same point, so they stop or go on together."""
        if not self.dist:
            return int(failed)
        import torch
        import torch.distributed as dist
        flag = torch.tensor([int(failed)], device=self.device)
        dist.all_reduce(flag)
        return int(flag.item())

    def max_over_ranks(self, value: float) -> float:
        """The largest ``value`` any rank passes (every rank calls it at the
        same point)."""
        if not self.dist:
            return float(value)
        import torch
        import torch.distributed as dist
        t = torch.tensor([float(value)], device=self.device, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    def group_name(self) -> str:
        """The torch.distributed group name (symmetric memory's rendezvous);
        on a lone GPU a world-size-1 NCCL group is started for it."""
        import torch.distributed as dist
        if not dist.is_initialized():
            _lone_process_group()
        return dist.group.WORLD.group_name


def _lone_process_group() -> None:
    """A world-size-1 NCCL default group for this process, on a fresh
    loopback port given in the init method (the environment is left alone:
    a MASTER_PORT set here would reach every process started later)."""
    import socket

    import torch.distributed as dist
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
