"""``AllReduceNorm``: Lamport all-reduce + residual add + RMSNorm.

``(norm_out, residual_out) = (RMSNorm(BF16(sum) + residual), BF16(sum) +
residual)`` where ``sum`` is the FP32 rank-ordered sum of every rank's BF16
``x`` rounded once to BF16 (not NCCL's per-hop rounding).

Placements: a torch process group (symmetric memory, construction is
collective), an existing :class:`Mailbox` (external peer table), or
:meth:`AllReduceNorm.virtual_ranks` (tp ranks in one process on one GPU,
see :class:`VirtualRanks`). With no group and no mailbox it is a single-rank
group (tp=1).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from kernels.validation import require_choice, require_range, require_tensor

from .compile import NormConfig, PublishConfig, cached
from .mailbox import Diagnosis, Mailbox, RankErrors, diagnose, require_multicast
from .norm import norm_threads
from .protocol import ERR_DEFAULT_RECORDS
from .publish import TRANSPORTS, publish_ctas_per_token


class LamportTimeout(RuntimeError):
    """A watchdog consumer gave up; ``diagnosis`` holds the group view."""

    def __init__(self, diagnosis: Diagnosis) -> None:
        super().__init__(diagnosis.message)
        self.diagnosis = diagnosis


@dataclasses.dataclass(frozen=True)
class AllReduceNormOptions:
    hidden_size: int
    max_num_tokens: int
    eps: float
    transport: str = "unicast"
    watchdog_ns: int = 0

    def validate(self) -> None:
        norm_threads(self.hidden_size)  # ValueError with the values
        if self.max_num_tokens < 1:
            raise ValueError(f"max_num_tokens must be >= 1, got {self.max_num_tokens}")
        if not self.eps > 0:
            raise ValueError(f"eps must be > 0, got {self.eps}")
        require_choice("transport", self.transport, TRANSPORTS)
        if self.watchdog_ns < 0:
            raise ValueError(f"watchdog_ns must be >= 0, got {self.watchdog_ns}")


def validate_inputs(x, residual, norm_weight, out=None, *, hidden: int, capacity: int,
                    device=None) -> int:
    """Check one rank's call arguments (ValueError naming the argument and
    the values); returns the token count M. No CUDA calls."""
    x = require_tensor("x", x, dtype=torch.bfloat16, shape=(None, hidden), align=16,
                       device=device)
    m = x.shape[0]
    require_range("x.shape[0] (tokens)", m, 1, capacity)
    require_tensor("residual", residual, dtype=torch.bfloat16, shape=(m, hidden), align=16,
                   device=device)
    require_tensor("norm_weight", norm_weight, dtype=torch.bfloat16, shape=(hidden,),
                   align=16, device=device)
    if out is not None:
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise ValueError(f"out must be a (norm_out, residual_out) pair, got {out!r:.80}")
        for name, t in zip(("out[0] (norm_out)", "out[1] (residual_out)"), out):
            require_tensor(name, t, dtype=torch.bfloat16, shape=(m, hidden), align=16,
                           device=device)
    return m


def _stream_handle(stream: torch.cuda.Stream | None):
    import cuda.bindings.driver as cuda

    stream = torch.cuda.current_stream() if stream is None else stream
    return cuda.CUstream(stream.cuda_stream)


class AllReduceNorm:
    """One rank of a Lamport all-reduce + norm group."""

    def __init__(self, *, hidden_size: int, max_num_tokens: int, eps: float,
                 transport: str = "unicast", watchdog_ns: int = 0, group=None,
                 mailbox: Mailbox | None = None, device=None,
                 allow_multicast: bool = False,
                 error_records: int = ERR_DEFAULT_RECORDS) -> None:
        self.options = AllReduceNormOptions(hidden_size, max_num_tokens, float(eps),
                                            transport, int(watchdog_ns))
        self.options.validate()
        self._group = group
        if mailbox is None:
            if group is not None:
                mailbox = Mailbox.symmetric(group=group, capacity=max_num_tokens,
                                            hidden=hidden_size, device=device,
                                            error_records=error_records)
            else:
                (mailbox,) = Mailbox.virtual_ranks(tp=1, capacity=max_num_tokens,
                                                   hidden=hidden_size, device=device,
                                                   error_records=error_records)
        elif (mailbox.capacity, mailbox.hidden) != (max_num_tokens, hidden_size):
            raise ValueError(
                f"mailbox is capacity={mailbox.capacity} hidden={mailbox.hidden}, "
                f"expected capacity={max_num_tokens} hidden={hidden_size}")
        self._mailbox = mailbox
        self.tp, self.rank, self.device = mailbox.tp, mailbox.rank, mailbox.device
        self.hidden_size, self.capacity, self.eps = hidden_size, max_num_tokens, float(eps)
        self.transport, self.watchdog_ns = transport, int(watchdog_ns)
        if transport == "multicast":
            self._destination = require_multicast(opt_in=allow_multicast,
                                                  multicast_ptr=mailbox.multicast_ptr)
        else:
            self._destination = mailbox.peer_table_ptr
        self._publish = cached(PublishConfig(tp=self.tp, transport=transport))
        self._norm = cached(NormConfig(hidden=hidden_size, tp=self.tp,
                                       watchdog_ns=self.watchdog_ns))
        self._ctas = publish_ctas_per_token(hidden_size)
        self._virtual_peers = False  # set by VirtualRanks for tp > 1

    # -- introspection
    @classmethod
    def virtual_ranks(cls, *, tp: int, hidden_size: int, max_num_tokens: int,
                      eps: float, **kwargs) -> "VirtualRanks":
        return VirtualRanks(tp=tp, hidden_size=hidden_size,
                            max_num_tokens=max_num_tokens, eps=eps, **kwargs)

    @property
    def mailbox(self) -> Mailbox:
        return self._mailbox

    def supports(self, tokens: int) -> bool:
        return 1 <= tokens <= self.capacity

    # -- validation
    def validate(self, x, residual, norm_weight, out=None) -> int:
        """All checks before any launch; returns M."""
        return validate_inputs(x, residual, norm_weight, out, hidden=self.hidden_size,
                               capacity=self.capacity, device=self.device)

    # -- launches (no validation: __call__ validates)
    def publish(self, x: torch.Tensor, *, stream: torch.cuda.Stream | None = None) -> None:
        """Launch this rank's publish of ``x`` on ``stream`` (default current)."""
        mb = self._mailbox
        self._publish(x.data_ptr(), mb.stage_state_ptr, self._destination, mb.error_ptr,
                      self.rank, self.capacity, self.hidden_size, self._ctas, x.shape[0],
                      _stream_handle(stream))

    def consume(self, residual: torch.Tensor, norm_weight: torch.Tensor,
                out: tuple[torch.Tensor, torch.Tensor], *,
                stream: torch.cuda.Stream | None = None) -> None:
        """Launch this rank's consumer (spin + sum + residual + RMSNorm)."""
        mb = self._mailbox
        norm_out, residual_out = out
        self._norm(mb.buffer_ptr, residual.data_ptr(), norm_weight.data_ptr(),
                   residual_out.data_ptr(), norm_out.data_ptr(), mb.stage_state_ptr,
                   mb.error_ptr, self.capacity, mb.error_records, self.eps,
                   residual.shape[0], _stream_handle(stream))

    def __call__(self, x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor,
                 *, out: tuple[torch.Tensor, torch.Tensor] | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(norm_out, residual_out)``; publish and norm chained with PDL on
        the current stream. Capturable in a CUDA graph (pass ``out``)."""
        if self._virtual_peers:
            raise RuntimeError(
                f"rank {self.rank} of tp={self.tp} virtual ranks: call the VirtualRanks group "
                "(one stream per rank); a lone rank's consumer would wait forever for peers "
                "queued behind it on the same stream")
        self.validate(x, residual, norm_weight, out)
        if out is None:
            out = (torch.empty_like(residual), torch.empty_like(residual))
        self.publish(x)
        self.consume(residual, norm_weight, out)
        return out

    # -- faults
    def errors(self) -> RankErrors:
        return self._mailbox.read_errors()

    def diagnose(self) -> Diagnosis:
        """Group diagnosis (collective over the group when there is one)."""
        mine = self.errors()
        if self._group is None:
            return diagnose([mine])
        import torch.distributed as dist

        reports: list = [None] * self.tp
        dist.all_gather_object(reports, mine, group=self._group)
        return diagnose(reports)

    def check(self) -> None:
        """Raise :class:`LamportTimeout` if any rank of the group recorded an error."""
        d = self.diagnose()
        if not d.ok:
            raise LamportTimeout(d)

    def recover(self) -> None:
        """Group-level recovery (collective): quiesce, barrier, refill every
        mailbox with the sentinel, reset stage state and errors, barrier."""
        torch.cuda.synchronize(self.device)
        if self._group is not None:
            import torch.distributed as dist

            dist.barrier(group=self._group)
        self._mailbox.scrub()
        torch.cuda.synchronize(self.device)
        if self._group is not None:
            dist.barrier(group=self._group)


class VirtualRanks:
    """tp ranks in one process on one GPU, one stream each.

    ``__call__`` forks from the current stream, launches every rank's
    publish, makes every rank's consumer stream wait on every publish event
    (so spinning consumers can never occupy the GPU while a publish is still
    queued), then joins back. It is capturable in a CUDA graph. Set
    ``CUDA_DEVICE_MAX_CONNECTIONS=32`` before CUDA starts when tp is large.
    """

    def __init__(self, *, tp: int, hidden_size: int, max_num_tokens: int, eps: float,
                 transport: str = "unicast", watchdog_ns: int = 0, device=None,
                 error_records: int = ERR_DEFAULT_RECORDS) -> None:
        if transport != "unicast":
            raise ValueError(f"virtual ranks support transport='unicast' only, got {transport!r}")
        AllReduceNormOptions(hidden_size, max_num_tokens, float(eps), transport,
                             int(watchdog_ns)).validate()
        boxes = Mailbox.virtual_ranks(tp=tp, capacity=max_num_tokens, hidden=hidden_size,
                                      device=device, error_records=error_records)
        self.ranks = [AllReduceNorm(hidden_size=hidden_size, max_num_tokens=max_num_tokens,
                                    eps=eps, transport=transport, watchdog_ns=watchdog_ns,
                                    mailbox=b) for b in boxes]
        for r in self.ranks:
            r._virtual_peers = tp > 1
        self.tp, self.device = tp, boxes[0].device
        self.capacity, self.hidden_size = max_num_tokens, hidden_size
        self._streams = [torch.cuda.Stream(device=self.device) for _ in range(tp)]

    def supports(self, tokens: int) -> bool:
        return 1 <= tokens <= self.capacity

    def __call__(self, xs: Sequence[torch.Tensor], residuals: Sequence[torch.Tensor],
                 norm_weight: torch.Tensor, *, outs=None, skip_publish: Sequence[int] = ()):
        """Run every rank; returns a list of ``(norm_out, residual_out)``.

        ``skip_publish``: ranks whose publish is not launched (fault
        injection; use a watchdog variant).
        """
        if len(xs) != self.tp or len(residuals) != self.tp:
            raise ValueError(f"xs and residuals must hold tp={self.tp} tensors, "
                             f"got {len(xs)} and {len(residuals)}")
        ms = {r.validate(x, res, norm_weight, None if outs is None else outs[i])
              for i, (r, x, res) in enumerate(zip(self.ranks, xs, residuals))}
        if len(ms) != 1:
            raise ValueError(f"every rank must pass the same token count, got {sorted(ms)}")
        if outs is None:
            outs = [(torch.empty_like(res), torch.empty_like(res)) for res in residuals]
        if any(s not in range(self.tp) for s in skip_publish):
            raise ValueError(f"skip_publish must name ranks in [0, {self.tp}), got {list(skip_publish)}")
        main = torch.cuda.current_stream(self.device)
        start = torch.cuda.Event()
        start.record(main)
        published = []
        for rank, stream in zip(self.ranks, self._streams):
            stream.wait_event(start)
            if rank.rank not in skip_publish:
                rank.publish(xs[rank.rank], stream=stream)
            ev = torch.cuda.Event()
            ev.record(stream)
            published.append(ev)
        for rank, stream in zip(self.ranks, self._streams):
            for ev in published:
                stream.wait_event(ev)
            rank.consume(residuals[rank.rank], norm_weight, outs[rank.rank], stream=stream)
        for stream in self._streams:
            done = torch.cuda.Event()
            done.record(stream)
            main.wait_event(done)
        if not torch.cuda.is_current_stream_capturing():
            for t in [*xs, *residuals, norm_weight, *(o for pair in outs for o in pair)]:
                for stream in self._streams:
                    t.record_stream(stream)
        return outs

    def errors(self) -> list[RankErrors]:
        torch.cuda.synchronize(self.device)
        return [r.errors() for r in self.ranks]

    def diagnose(self) -> Diagnosis:
        return diagnose(self.errors())

    def check(self) -> None:
        d = self.diagnose()
        if not d.ok:
            raise LamportTimeout(d)

    def is_all_sentinel(self) -> bool:
        return all(r.mailbox.is_all_sentinel() for r in self.ranks)

    def recover(self) -> None:
        """Quiesce every rank, scrub every mailbox and stage state, resync."""
        torch.cuda.synchronize(self.device)
        for r in self.ranks:
            r.mailbox.scrub()
        torch.cuda.synchronize(self.device)
