"""``AllReduceNorm``: Lamport all-reduce + residual add + RMSNorm.

``(norm_out, residual_out) = (RMSNorm(BF16(sum) + residual), BF16(sum) +
residual)`` where ``sum`` is the FP32 rank-ordered sum of every rank's BF16
``x`` rounded once to BF16 (not NCCL's per-hop rounding).

Placements: a torch process group (symmetric memory, construction is
collective), an existing :class:`Mailbox` (external peer table), or
:meth:`AllReduceNorm.virtual_ranks` (tp ranks in one process on one GPU,
see :class:`VirtualRanks`). With no group and no mailbox it is a single-rank
group (tp=1).

The same instance (one mailbox, one stage rotation) also serves
- a MoE output whose routed top-k reduction is still open
  (:class:`kernels.moe.MoEOutput`): ``__call__`` dispatches to the finalize
  publish (:mod:`kernels.lamport.finalize_publish`) compiled for the weight
  dtype (construct with ``top_k``), or, where the tuning picks it, to the
  single-kernel finalize (:mod:`kernels.lamport.finalize_single`);
- the MTP draft's embedding: :meth:`AllReduceNorm.prepare_embedding` then
  :meth:`AllReduceNorm.embed_norm` (:mod:`kernels.lamport.embed`, or, where
  the tuning picks it, :mod:`kernels.lamport.embed_single`).
Calls of the three kinds interleave freely on one instance (every rank makes
the same sequence of calls with the same token count).

``mode`` (fixed per instance, :data:`kernels.lamport.protocol.MODES`):
- ``"one_shot"`` (default): every rank sends every token to every rank and
  gets every token's ``(norm_out, residual_out)``, ``[M, hidden]``;
- ``"owner"`` (reduce-scatter + RMSNorm, for larger batches): rank ``r``
  sends token ``t`` only to its owner ``t % tp`` and gets the rows of the
  tokens it owns: ``residual``, ``norm_out`` and ``residual_out`` are
  ``[ceil(M / tp), hidden]``, row ``j`` being token ``j * tp + r`` (rows with
  ``j * tp + r >= M`` hold no token: +0.0 out, residual not read). Same
  numerical contract per owned row (the one-shot result's rows:
  :func:`kernels.reference.allreduce.owner_all_reduce_norm`); unicast only;
  the mailbox it allocates holds ``ceil(max_num_tokens / tp)`` rows per
  source (a given one needs at least that many: a one-shot-sized mailbox of
  the group serves too); the embedding path is one-shot only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from kernels.moe import MoEOutput, RoutedExperts
from kernels.validation import (norm_threads, require_choice, require_int, require_number,
                                require_range, require_tensor, require_tp)

from .compile import (EmbedNormConfig, EmbedPublishConfig, FinalizePublishConfig,
                      NormConfig, PublishConfig, SingleEmbedNormConfig,
                      SingleFinalizeNormConfig, SingleNormConfig, cached)
from .diagnosis import GroupDiagnosis, diagnose_errors
from .finalize_publish import (FinalizeTuning, check_finalize_options,
                               finalize_ctas_per_token)
from .mailbox import Mailbox, RankErrors, require_multicast
from .norm_tuning import NormTuning, check_sync
from .norm_tuning import norm_tuning as norm_tuning_for
from .protocol import (ERR_DEFAULT_RECORDS, MODES, SINGLE_SYNCS, VEC_BF16, owner_capacity,
                       owner_rows)
from .publish import TRANSPORTS, check_owner_transport, publish_ctas_per_token


class LamportTimeout(RuntimeError):
    """A watchdog consumer gave up; ``diagnosis`` holds the group view."""

    def __init__(self, diagnosis: GroupDiagnosis) -> None:
        super().__init__(diagnosis.summary())
        self.diagnosis = diagnosis


@dataclasses.dataclass(frozen=True)
class AllReduceNormOptions:
    hidden_size: int
    max_num_tokens: int
    eps: float
    transport: str = "unicast"
    budget_ns: int = 0
    mode: str = "one_shot"

    def validate(self) -> None:
        """ValueError/TypeError naming the option and its value; no CUDA calls."""
        norm_threads(self.hidden_size)
        require_int("max_num_tokens", self.max_num_tokens, low=1)
        require_number("eps", self.eps, positive=True)
        require_choice("transport", self.transport, TRANSPORTS)
        require_int("budget_ns", self.budget_ns, low=0)
        require_choice("mode", self.mode, MODES)
        check_owner_transport(self.mode == "owner", self.transport)

    def mailbox_rows(self, tp: int) -> int:
        """Rows per source rank in a mailbox of this mode (the owner capacity
        ``ceil(max_num_tokens / tp)`` in owner mode)."""
        return owner_capacity(self.max_num_tokens, tp) if self.mode == "owner" \
            else self.max_num_tokens

    def check_mailbox(self, tp: int, capacity: int, hidden: int) -> None:
        """A given mailbox fits this mode: hidden equal, capacity equal to
        max_num_tokens (one-shot) or at least the owner capacity (owner mode:
        the row stride is the mailbox's, so a one-shot-sized mailbox of the
        same group serves owner calls too). ValueError naming the values."""
        rows = self.mailbox_rows(tp)
        fits = capacity >= rows if self.mode == "owner" else capacity == rows
        if hidden != self.hidden_size or not fits:
            raise ValueError(
                f"mailbox is capacity={capacity} hidden={hidden}, expected capacity "
                f"{'>= ' if self.mode == 'owner' else ''}{rows} hidden={self.hidden_size} "
                f"(mode={self.mode!r}, max_num_tokens={self.max_num_tokens}, tp={tp})")


def check_norm_tuning(tuning: NormTuning, mode: str, *, tp: int, transport: str) -> None:
    """A given :class:`NormTuning` is valid, allows the single kernel only
    in one-shot mode, and its agreement fits ``tp`` and ``transport``
    (:func:`kernels.lamport.norm_tuning.check_sync`); ValueError naming it."""
    tuning.validate()
    check_sync(tuning, tp=tp, transport=transport)
    if mode != "one_shot" and tuning.any_single:
        raise ValueError(f"norm_tuning={tuning!r}: the single-kernel form is one-shot only; "
                         f"this instance has mode={mode!r}")


def _tokens(x) -> int:
    """M of a call's input: a partial's rows or a MoE output's tokens."""
    return x.tokens if isinstance(x, MoEOutput) else x.shape[0]


def output_rows(mode: str, m: int, tp: int) -> int:
    """Rows of ``residual`` / the outputs for an M-token call."""
    return owner_rows(m, tp) if mode == "owner" else m


def validate_inputs(x, residual, norm_weight, out=None, *, hidden: int, capacity: int,
                    device=None, top_k: int | None = None, fragment_bytes: int = 16,
                    mode: str = "one_shot", tp: int = 1) -> int:
    """Check one rank's call arguments (ValueError naming the argument and
    the values); returns the token count M. No CUDA calls. ``x`` may be a
    :class:`MoEOutput` (see :func:`validate_moe`). In owner mode ``residual``
    and ``out`` hold ``ceil(M / tp)`` rows."""
    if isinstance(x, MoEOutput):
        m = validate_moe(x, hidden=hidden, capacity=capacity, device=device, top_k=top_k,
                         fragment_bytes=fragment_bytes)
    else:
        x = require_tensor("x", x, dtype=torch.bfloat16, shape=(None, hidden), align=16,
                           device=device)
        m = x.shape[0]
        require_range("x.shape[0] (tokens)", m, 1, capacity)
    rows = output_rows(mode, m, tp)
    require_tensor("residual", residual, dtype=torch.bfloat16, shape=(rows, hidden), align=16,
                   device=device)
    require_tensor("norm_weight", norm_weight, dtype=torch.bfloat16, shape=(hidden,),
                   align=16, device=device)
    if out is not None:
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise ValueError(f"out must be a (norm_out, residual_out) pair, got {out!r:.80}")
        for name, t in zip(("out[0] (norm_out)", "out[1] (residual_out)"), out):
            require_tensor(name, t, dtype=torch.bfloat16, shape=(rows, hidden), align=16,
                           device=device)
    return m


def validate_moe(moe, *, hidden: int, capacity: int, device=None, top_k: int | None,
                 fragment_bytes: int = 16) -> int:
    """Check a :class:`MoEOutput` before the finalize publish: shapes and
    dtypes of the weights and route indices matching ``top_k``, the GEMM2
    rows and shared output matching ``hidden`` and aligned for the
    ``fragment_bytes`` (8 or 16) loads. Metadata only: the route values are
    not read (no host sync); an index outside ``[-1, rows)`` makes the
    kernel publish NaN for that token instead of loading out of bounds.
    Returns M."""
    if not isinstance(moe, MoEOutput):
        raise ValueError(f"x must be a torch.Tensor or a MoEOutput, got {type(moe).__name__}")
    if top_k is None:
        raise ValueError("a MoEOutput needs an AllReduceNorm constructed with top_k=...")
    routed = moe.routed
    if not isinstance(routed, RoutedExperts):
        raise ValueError(f"x.routed must be a RoutedExperts (routed reduction still open), "
                         f"got {type(routed).__name__}")
    weights = require_tensor("x.routed.expert_weights", routed.expert_weights,
                             dtype=(torch.float32, torch.bfloat16), device=device)
    require_tensor("x.routed.expert_weights", weights, align=weights.element_size())
    if weights.dim() != 2 or weights.shape[1] != top_k:
        raise ValueError(f"x.routed.expert_weights must have shape [*, top_k={top_k}], got "
                         f"{weights.dtype}{list(weights.shape)}")
    m = weights.shape[0]
    require_range("x.routed.expert_weights.shape[0] (tokens)", m, 1, capacity)
    require_tensor("x.routed.expanded_idx_to_permuted_idx",
                   routed.expanded_idx_to_permuted_idx, dtype=torch.int32, shape=(m, top_k),
                   align=4, device=device)
    gemm2 = require_tensor("x.routed.gemm2_permuted", routed.gemm2_permuted,
                           dtype=torch.bfloat16, shape=(None, hidden), align=fragment_bytes,
                           device=device)
    if gemm2.shape[0] >= 2**31:
        raise ValueError(f"x.routed.gemm2_permuted has {gemm2.shape[0]} rows, at most 2^31-1")
    if moe.shared_output is not None:
        require_tensor("x.shared_output", moe.shared_output, dtype=torch.bfloat16,
                       shape=(m, hidden), align=fragment_bytes, device=device)
    return m


def validate_embedding_shard(weight, start, rows, eps, *, hidden: int,
                             device=None) -> tuple[int, int, float]:
    """Check :meth:`AllReduceNorm.prepare_embedding`'s arguments; returns
    ``(start, rows, eps)`` (``rows`` None = every row of ``weight``)."""
    require_tensor("weight", weight, dtype=torch.bfloat16, shape=(None, hidden), align=16,
                   device=device)
    rows = weight.shape[0] if rows is None else rows
    if isinstance(rows, bool) or not isinstance(rows, int):
        raise ValueError(f"rows must be an int, got {rows!r}")
    if isinstance(start, bool) or not isinstance(start, int):
        raise ValueError(f"start must be an int, got {start!r}")
    require_range("rows", rows, 0, weight.shape[0])
    require_range("start", start, 0, 2**31 - 1 - rows)
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    return start, rows, float(eps)


def validate_embedding_inputs(ids, positions, previous, enorm, hnorm, out=None, *,
                              hidden: int, capacity: int, device=None) -> int:
    """Check :meth:`AllReduceNorm.embed_norm`'s tensors (ValueError naming the
    argument); returns M. No CUDA calls."""
    h, dev = hidden, device
    ids = require_tensor("ids", ids, dtype=torch.int32, shape=(None,), align=4, device=dev)
    m = ids.shape[0]
    require_range("ids.shape[0] (tokens)", m, 1, capacity)
    require_tensor("positions", positions, dtype=torch.int64, shape=(m,), align=8, device=dev)
    require_tensor("previous", previous, dtype=torch.bfloat16, shape=(m, h), align=16,
                   device=dev)
    require_tensor("enorm", enorm, dtype=torch.bfloat16, shape=(h,), align=16, device=dev)
    require_tensor("hnorm", hnorm, dtype=torch.bfloat16, shape=(h,), align=16, device=dev)
    if out is not None:
        require_tensor("out", out, dtype=torch.bfloat16, shape=(m, 2 * h), align=16, device=dev)
    return m


def _moe_tensors(xs) -> list[torch.Tensor]:
    out = []
    for x in xs:
        out += x.tensors() if isinstance(x, MoEOutput) else [x]
    return out


def _stream_handle(stream: torch.cuda.Stream | None):
    import cuda.bindings.driver as cuda

    stream = torch.cuda.current_stream() if stream is None else stream
    return cuda.CUstream(stream.cuda_stream)


class LamportGroupMember:
    """Fault handling shared by the host classes of one rank of a Lamport
    group (``AllReduceNorm``, ``AllReduceMHC``): they provide ``_mailbox``,
    ``_group`` (a torch process group or None), ``tp`` and ``device``."""

    def errors(self) -> RankErrors:
        return self._mailbox.read_errors()

    def diagnose(self) -> GroupDiagnosis:
        """Group diagnosis (collective over the group when there is one;
        :func:`kernels.lamport.diagnosis.diagnose_errors`)."""
        mine = self.errors()
        if self._group is None:
            return diagnose_errors([mine])
        import torch.distributed as dist

        reports: list = [None] * self.tp
        dist.all_gather_object(reports, mine, group=self._group)
        return diagnose_errors(reports)

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


class AllReduceNorm(LamportGroupMember):
    """One rank of a Lamport all-reduce + norm group."""

    def __init__(self, *, hidden_size: int, max_num_tokens: int, eps: float,
                 transport: str = "unicast", budget_ns: int = 0, group=None,
                 mailbox: Mailbox | None = None, device=None,
                 allow_multicast: bool = False,
                 error_records: int = ERR_DEFAULT_RECORDS, top_k: int | None = None,
                 routed_scaling_factor: float = 1.0,
                 finalize_tuning: FinalizeTuning | None = None, mode: str = "one_shot",
                 norm_tuning: NormTuning | None = None, plant_delay_cycles: int = 0) -> None:
        """``plant_delay_cycles`` > 0: test-only, the single kernel slowed on
        purpose (:attr:`kernels.lamport.norm_single.SingleNormKernel.plant_delay_cycles`;
        ValueError where this instance never launches the single kernel)."""
        finalize_tuning = FinalizeTuning() if finalize_tuning is None else finalize_tuning
        if top_k is not None:
            finalize_tuning.validate(top_k)
            check_finalize_options(
                tp=1, top_k=top_k, elements_per_thread=finalize_tuning.elements_per_thread,
                routed_scaling_factor=float(routed_scaling_factor), shared="after",
                prefetch_group=finalize_tuning.prefetch_group or top_k, transport=transport)
        options = AllReduceNormOptions(hidden_size, max_num_tokens, eps, transport, budget_ns,
                                       mode)
        options.validate()
        if norm_tuning is not None:
            import torch.distributed as dist
            tp = mailbox.tp if mailbox is not None else \
                dist.get_world_size(group) if group is not None else 1
            check_norm_tuning(norm_tuning, mode, tp=tp, transport=transport)
        self.options = dataclasses.replace(options, eps=float(eps))
        self._group = group
        if mailbox is None:
            if group is not None:
                import torch.distributed as dist

                rows = self.options.mailbox_rows(dist.get_world_size(group))
                mailbox = Mailbox.symmetric(group=group, capacity=rows,
                                            hidden=hidden_size, device=device,
                                            error_records=error_records)
            else:
                (mailbox,) = Mailbox.virtual_ranks(tp=1, capacity=max_num_tokens,
                                                   hidden=hidden_size, device=device,
                                                   error_records=error_records)
        else:
            self.options.check_mailbox(mailbox.tp, mailbox.capacity, mailbox.hidden)
        self._mailbox = mailbox
        self.tp, self.rank, self.device = mailbox.tp, mailbox.rank, mailbox.device
        self.hidden_size, self.capacity, self.eps = hidden_size, max_num_tokens, float(eps)
        self.transport, self.budget_ns = transport, int(budget_ns)
        self.mode = mode
        if transport == "multicast":
            self._destination = require_multicast(opt_in=allow_multicast,
                                                  multicast_ptr=mailbox.multicast_ptr)
        else:
            self._destination = mailbox.peer_table_ptr
        self._publish = cached(PublishConfig(tp=self.tp, transport=transport, mode=mode))
        self._norm = cached(NormConfig(hidden=hidden_size, tp=self.tp,
                                       budget_ns=self.budget_ns, mode=mode))
        self._ctas = publish_ctas_per_token(hidden_size)
        self._virtual_peers = False  # set by VirtualRanks for tp > 1
        # Which form a plain one-shot call launches (kernels.lamport.norm_tuning).
        self.norm_tuning = norm_tuning if norm_tuning is not None else \
            norm_tuning_for(hidden=hidden_size, tp=self.tp) if mode == "one_shot" else \
            NormTuning(0, source="owner mode: two kernels always")
        require_int("plant_delay_cycles", plant_delay_cycles, low=0)
        if plant_delay_cycles and not self.norm_tuning.single_max_tokens:
            raise ValueError(f"plant_delay_cycles={plant_delay_cycles}: only the single kernel "
                             f"carries a planted delay, and norm_tuning={self.norm_tuning!r} "
                             f"never launches it")
        self._single = cached(SingleNormConfig(hidden=hidden_size, tp=self.tp,
                                               budget_ns=self.budget_ns, transport=transport,
                                               plant_delay_cycles=plant_delay_cycles)) \
            if self.norm_tuning.single_max_tokens else None
        # MoE finalize publish: one compile per (weight dtype, shared expert or not).
        self.top_k, self.routed_scaling_factor = top_k, float(routed_scaling_factor)
        self.finalize_tuning = finalize_tuning
        self._finalize = {}
        if top_k is not None:
            t = finalize_tuning
            for dtype in (torch.float32, torch.bfloat16):
                for has_shared in (True, False):
                    self._finalize[dtype, has_shared] = cached(FinalizePublishConfig(
                        tp=self.tp, top_k=top_k, elements_per_thread=t.elements_per_thread,
                        fp32_weights=dtype == torch.float32,
                        routed_scaling_factor=self.routed_scaling_factor,
                        shared=("before" if t.load_shared_before_pdl else "after")
                        if has_shared else "none",
                        prefetch_group=t.prefetch_group, transport=transport, mode=mode))
            self._finalize_ctas = finalize_ctas_per_token(hidden_size,
                                                          t.elements_per_thread)
        # Its single-kernel form, where the tuning picks it and a token's CTA
        # has a thread a route (kernels.lamport.finalize_single).
        self._single_finalize = {}
        if top_k is not None and self.norm_tuning.finalize_max_tokens and \
                top_k <= hidden_size // VEC_BF16:
            t = finalize_tuning
            for dtype in (torch.float32, torch.bfloat16):
                for has_shared in (True, False):
                    self._single_finalize[dtype, has_shared] = cached(SingleFinalizeNormConfig(
                        hidden=hidden_size, tp=self.tp, top_k=top_k, budget_ns=self.budget_ns,
                        fp32_weights=dtype == torch.float32,
                        routed_scaling_factor=self.routed_scaling_factor,
                        shared=("before" if t.load_shared_before_pdl else "after")
                        if has_shared else "none",
                        prefetch_group=t.prefetch_group, transport=transport))
        # Embedding: weight.data_ptr() -> (weight, start, rows, eps).
        self._embeddings: dict[int, tuple[torch.Tensor, int, int, float]] = {}
        self._embed_publish = None
        self._embed_norm = None
        self._single_embed = None

    def form(self, x) -> str:
        """``"single"`` or ``"two"``: the form :meth:`__call__` launches for
        ``x`` (a MoEOutput: the single finalize kernel only where it was
        compiled, see the constructor; virtual ranks: two always)."""
        if self._virtual_peers:
            return "two"
        if isinstance(x, MoEOutput):
            if not self._single_finalize:
                return "two"
            return self.norm_tuning.form(_tokens(x), path="finalize")
        return self.norm_tuning.form(x.shape[0])

    def variant(self, x) -> str:
        """What :meth:`__call__` launches for ``x``, as the profile rows name
        it: ``two``, or the single kernel with its agreement
        (:meth:`kernels.lamport.norm_tuning.NormTuning.variant`)."""
        if self.form(x) == "two":
            return "two"
        return self.norm_tuning.variant(_tokens(x),
                                        path="finalize" if isinstance(x, MoEOutput) else "plain")

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
        m = validate_inputs(x, residual, norm_weight, out, hidden=self.hidden_size,
                            capacity=self.capacity, device=self.device, top_k=self.top_k,
                            fragment_bytes=2 * self.finalize_tuning.elements_per_thread,
                            mode=self.mode, tp=self.tp)
        if isinstance(x, MoEOutput) and self.form(x) == "single":
            # The single finalize loads 16-byte fragments whatever the tuning's width.
            validate_moe(x, hidden=self.hidden_size, capacity=self.capacity,
                         device=self.device, top_k=self.top_k, fragment_bytes=16)
        return m

    # -- launches (no validation: __call__ validates)
    def publish(self, x: torch.Tensor | MoEOutput, *,
                stream: torch.cuda.Stream | None = None) -> None:
        """Launch this rank's publish of ``x`` on ``stream`` (default current);
        a :class:`MoEOutput` goes through the finalize publish."""
        if isinstance(x, MoEOutput):
            self._publish_moe(x, stream)
            return
        mb = self._mailbox
        self._publish(x.data_ptr(), mb.stage_state_ptr, self._destination, mb.error_ptr,
                      self.rank, mb.capacity, self.hidden_size, self._ctas, x.shape[0],
                      _stream_handle(stream))

    def _publish_moe(self, moe: MoEOutput, stream) -> None:
        mb = self._mailbox
        r = moe.routed
        shared = moe.shared_output
        kernel = self._finalize[r.expert_weights.dtype, shared is not None]
        kernel(r.gemm2_permuted.data_ptr(), r.expert_weights.data_ptr(),
               r.expanded_idx_to_permuted_idx.data_ptr(),
               0 if shared is None else shared.data_ptr(), r.gemm2_permuted.shape[0],
               mb.stage_state_ptr, self._destination, mb.error_ptr, self.rank, mb.capacity,
               self.hidden_size, self._finalize_ctas, r.expert_weights.shape[0],
               _stream_handle(stream))

    def consume(self, residual: torch.Tensor, norm_weight: torch.Tensor,
                out: tuple[torch.Tensor, torch.Tensor], *,
                stream: torch.cuda.Stream | None = None, tokens: int | None = None) -> None:
        """Launch this rank's consumer (spin + sum + residual + RMSNorm) of a
        ``tokens``-token call (default ``residual.shape[0]``; owner mode needs
        it: its residual holds only the owned rows)."""
        mb = self._mailbox
        norm_out, residual_out = out
        m = residual.shape[0] if tokens is None else tokens
        self._norm(mb.buffer_ptr, residual.data_ptr(), norm_weight.data_ptr(),
                   residual_out.data_ptr(), norm_out.data_ptr(), mb.stage_state_ptr,
                   mb.error_ptr, mb.capacity, mb.error_records, self.eps,
                   m, self.rank, _stream_handle(stream))

    def __call__(self, x: torch.Tensor | MoEOutput, residual: torch.Tensor,
                 norm_weight: torch.Tensor, *,
                 out: tuple[torch.Tensor, torch.Tensor] | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(norm_out, residual_out)``; publish and norm chained with PDL on
        the current stream. Capturable in a CUDA graph (pass ``out``).

        ``x``: [M, hidden] BF16 TP-partial, or a :class:`MoEOutput` whose
        routed top-k reduction is finalized inside the publish (FP32 or BF16
        weights pick the compiled kernel). ``residual`` and the outputs are
        [M, hidden] (one-shot) or this rank's owned rows [ceil(M / tp),
        hidden] (owner mode; row j = token j * tp + rank)."""
        if self._virtual_peers:
            raise RuntimeError(
                f"rank {self.rank} of tp={self.tp} virtual ranks: call the VirtualRanks group "
                "(one stream per rank); a lone rank's consumer would wait forever for peers "
                "queued behind it on the same stream")
        m = self.validate(x, residual, norm_weight, out)
        if out is None:
            out = (torch.empty_like(residual), torch.empty_like(residual))
        if self.form(x) == "single":
            self.publish_and_consume(x, residual, norm_weight, out)
            return out
        self.publish(x)
        self.consume(residual, norm_weight, out, tokens=m)
        return out

    def publish_and_consume(self, x: torch.Tensor | MoEOutput, residual: torch.Tensor,
                            norm_weight: torch.Tensor, out: tuple[torch.Tensor, torch.Tensor],
                            *, stream: torch.cuda.Stream | None = None) -> None:
        """Launch the single-kernel form (:mod:`kernels.lamport.norm_single`,
        or :mod:`kernels.lamport.finalize_single` for a MoE output) of a
        one-shot call on ``stream``; no validation (:meth:`__call__`
        validates and picks the form). Needs a tuning that allows it (the
        kernel is compiled at construction only then)."""
        mb = self._mailbox
        norm_out, residual_out = out
        m = _tokens(x)
        tail = (mb.buffer_ptr, self._destination, residual.data_ptr(), norm_weight.data_ptr(),
                residual_out.data_ptr(), norm_out.data_ptr(), mb.stage_state_ptr, mb.error_ptr,
                mb.capacity, mb.error_records, self.eps, m, self.rank, *self._sync(m),
                _stream_handle(stream))
        if isinstance(x, MoEOutput):
            r, shared = x.routed, x.shared_output
            kernel = self._single_finalize.get((r.expert_weights.dtype, shared is not None))
            if kernel is None:
                raise RuntimeError(f"norm_tuning={self.norm_tuning!r} (top_k={self.top_k}, "
                                   f"hidden={self.hidden_size}) never picks the single "
                                   f"finalize kernel, so it was not compiled")
            kernel(r.gemm2_permuted.data_ptr(), r.expert_weights.data_ptr(),
                   r.expanded_idx_to_permuted_idx.data_ptr(),
                   0 if shared is None else shared.data_ptr(), r.gemm2_permuted.shape[0], *tail)
            return
        if self._single is None:
            raise RuntimeError(f"norm_tuning={self.norm_tuning!r} never picks the single "
                               f"kernel, so it was not compiled")
        self._single(x.data_ptr(), *tail)

    def _sync(self, tokens: int) -> tuple[int, int]:
        """The single kernel's ``sync`` index and cluster size for ``tokens``."""
        sync, cluster = self.norm_tuning.launch_sync(tokens)
        return SINGLE_SYNCS.index(sync), cluster

    # -- embedding (the MTP draft's input)
    def prepare_embedding(self, weight: torch.Tensor, start: int, rows: int | None = None,
                          eps: float | None = None) -> None:
        """Register (and compile for) the vocabulary shard ``weight``
        ([R, hidden] BF16) whose first ``rows`` rows (default R) hold token
        ids ``[start, start + rows)``; ``eps`` (default the instance's) is
        the enorm / hnorm epsilon. Call once per shard before
        :meth:`embed_norm` (and before capturing it in a graph)."""
        if self.mode != "one_shot":
            raise ValueError(f"the embedding path is one-shot only (every rank needs every "
                             f"token's embedding); this instance has mode={self.mode!r}")
        start, rows, eps = validate_embedding_shard(
            weight, start, rows, self.eps if eps is None else eps, hidden=self.hidden_size,
            device=self.device)
        if self._embed_publish is None:
            self._embed_publish = cached(EmbedPublishConfig(tp=self.tp,
                                                            transport=self.transport))
            self._embed_norm = cached(EmbedNormConfig(hidden=self.hidden_size, tp=self.tp,
                                                      budget_ns=self.budget_ns))
            if self.norm_tuning.embed_max_tokens:
                self._single_embed = cached(SingleEmbedNormConfig(
                    hidden=self.hidden_size, tp=self.tp, budget_ns=self.budget_ns,
                    transport=self.transport))
        self._embeddings[weight.data_ptr()] = (weight, start, rows, eps)

    def embed_form(self, ids: torch.Tensor) -> str:
        """``"single"`` or ``"two"``: the form :meth:`embed_norm` launches
        for ``ids`` (virtual ranks: two always)."""
        if self._virtual_peers or self._single_embed is None:
            return "two"
        return self.norm_tuning.form(ids.shape[0], path="embed")

    def embed_variant(self, ids: torch.Tensor) -> str:
        """What :meth:`embed_norm` launches for ``ids``, as the profile rows
        name it (:meth:`variant`'s names)."""
        if self.embed_form(ids) == "two":
            return "two"
        return self.norm_tuning.variant(ids.shape[0], path="embed")

    def validate_embedding(self, ids, positions, previous, weight, enorm, hnorm,
                           out=None) -> int:
        """All checks of :meth:`embed_norm` before any launch; returns M."""
        require_tensor("weight", weight, dtype=torch.bfloat16, shape=(None, self.hidden_size),
                       device=self.device)
        entry = self._embeddings.get(weight.data_ptr())
        if entry is None or entry[0].shape != weight.shape:
            raise ValueError(f"weight {weight.dtype}{list(weight.shape)} at "
                             f"{weight.data_ptr():#x} was not prepared: call "
                             "prepare_embedding(weight, start, rows) first")
        return validate_embedding_inputs(ids, positions, previous, enorm, hnorm, out,
                                         hidden=self.hidden_size, capacity=self.capacity,
                                         device=self.device)

    def publish_embedding(self, ids: torch.Tensor, weight: torch.Tensor, *,
                          stream: torch.cuda.Stream | None = None) -> None:
        """Launch this rank's embedding publish (its rows of ``ids``, zeros
        for the ids of other shards)."""
        _, start, rows, _ = self._embeddings[weight.data_ptr()]
        mb = self._mailbox
        self._embed_publish(ids.data_ptr(), weight.data_ptr(), mb.stage_state_ptr,
                            self._destination, mb.error_ptr, self.rank, self.capacity,
                            self.hidden_size, start, rows, self._ctas, ids.shape[0],
                            _stream_handle(stream))

    def consume_embedding(self, positions: torch.Tensor, previous: torch.Tensor,
                          weight: torch.Tensor, enorm: torch.Tensor, hnorm: torch.Tensor,
                          out: torch.Tensor, *,
                          stream: torch.cuda.Stream | None = None) -> None:
        """Launch this rank's embed-norm consumer."""
        eps = self._embeddings[weight.data_ptr()][3]
        mb = self._mailbox
        self._embed_norm(mb.buffer_ptr, positions.data_ptr(), previous.data_ptr(),
                         enorm.data_ptr(), hnorm.data_ptr(), out.data_ptr(),
                         mb.stage_state_ptr, mb.error_ptr, self.capacity, mb.error_records,
                         eps, positions.shape[0], _stream_handle(stream))

    def embed_norm(self, ids: torch.Tensor, positions: torch.Tensor, previous: torch.Tensor,
                   weight: torch.Tensor, enorm: torch.Tensor, hnorm: torch.Tensor, *,
                   out: torch.Tensor | None = None) -> torch.Tensor:
        """``fused_eh_norm`` of the vocab-parallel embedding of ``ids``:
        ``[M, 2 * hidden]`` BF16 = ``[enorm(embedding), hnorm(previous)]``, the
        embedding zeroed where ``positions == 0``. ``ids`` int32 [M],
        ``positions`` int64 [M], ``previous`` BF16 [M, hidden], ``weight`` a
        shard registered with :meth:`prepare_embedding`. Publish and consumer
        chained with PDL on the current stream; capturable (pass ``out``)."""
        if self._virtual_peers:
            raise RuntimeError(f"rank {self.rank} of tp={self.tp} virtual ranks: call the "
                               "VirtualRanks group's embed_norm")
        m = self.validate_embedding(ids, positions, previous, weight, enorm, hnorm, out)
        if out is None:
            out = torch.empty(m, 2 * self.hidden_size, dtype=torch.bfloat16,
                              device=previous.device)
        if self.embed_form(ids) == "single":
            self.publish_and_consume_embedding(ids, positions, previous, weight, enorm, hnorm,
                                               out)
            return out
        self.publish_embedding(ids, weight)
        self.consume_embedding(positions, previous, weight, enorm, hnorm, out)
        return out

    def publish_and_consume_embedding(self, ids: torch.Tensor, positions: torch.Tensor,
                                      previous: torch.Tensor, weight: torch.Tensor,
                                      enorm: torch.Tensor, hnorm: torch.Tensor,
                                      out: torch.Tensor, *,
                                      stream: torch.cuda.Stream | None = None) -> None:
        """Launch the single-kernel embedding (:mod:`kernels.lamport.embed_single`)
        on ``stream``; no validation (:meth:`embed_norm` validates and picks
        the form)."""
        if self._single_embed is None:
            raise RuntimeError(f"norm_tuning={self.norm_tuning!r} never picks the single "
                               f"embedding kernel, so it was not compiled")
        _, start, rows, eps = self._embeddings[weight.data_ptr()]
        mb = self._mailbox
        m = ids.shape[0]
        self._single_embed(ids.data_ptr(), weight.data_ptr(), start, rows, positions.data_ptr(),
                           previous.data_ptr(), enorm.data_ptr(), hnorm.data_ptr(),
                           out.data_ptr(), mb.buffer_ptr, self._destination,
                           mb.stage_state_ptr, mb.error_ptr, mb.capacity, mb.error_records,
                           eps, m, self.rank, *self._sync(m), _stream_handle(stream))


VIRTUAL_NORM_TUNING = NormTuning(0, source="virtual ranks: two kernels always")
"""Virtual ranks never launch the single kernel (a rank's grid spinning on
one stream could hold the SMs a peer's grid queued on another needs)."""


class VirtualRanks:
    """tp ranks in one process on one GPU, one stream each.

    ``__call__`` forks from the current stream, launches every rank's
    publish, makes every rank's consumer stream wait on every publish event
    (so spinning consumers can never occupy the GPU while a publish is still
    queued), then joins back. It is capturable in a CUDA graph. Set
    ``CUDA_DEVICE_MAX_CONNECTIONS`` above tp (a queue per stream) before
    CUDA starts.
    """

    def __init__(self, *, tp: int, hidden_size: int, max_num_tokens: int, eps: float,
                 transport: str = "unicast", budget_ns: int = 0, device=None,
                 error_records: int = ERR_DEFAULT_RECORDS, top_k: int | None = None,
                 routed_scaling_factor: float = 1.0,
                 finalize_tuning: FinalizeTuning | None = None, mode: str = "one_shot") -> None:
        if transport != "unicast":
            raise ValueError(f"virtual ranks support transport='unicast' only, got {transport!r}")
        options = AllReduceNormOptions(hidden_size, max_num_tokens, eps, transport, budget_ns,
                                       mode)
        options.validate()
        require_tp("tp", tp)
        boxes = Mailbox.virtual_ranks(tp=tp, capacity=options.mailbox_rows(tp),
                                      hidden=hidden_size, device=device,
                                      error_records=error_records)
        self.ranks = [AllReduceNorm(hidden_size=hidden_size, max_num_tokens=max_num_tokens,
                                    eps=eps, transport=transport, budget_ns=budget_ns,
                                    mailbox=b, top_k=top_k,
                                    routed_scaling_factor=routed_scaling_factor,
                                    finalize_tuning=finalize_tuning, mode=mode,
                                    norm_tuning=VIRTUAL_NORM_TUNING) for b in boxes]
        for r in self.ranks:
            r._virtual_peers = tp > 1
        self.tp, self.device, self.mode = tp, boxes[0].device, mode
        self.capacity, self.hidden_size = max_num_tokens, hidden_size
        self._streams = [torch.cuda.Stream(device=self.device) for _ in range(tp)]

    def supports(self, tokens: int) -> bool:
        return 1 <= tokens <= self.capacity

    def __call__(self, xs: Sequence[torch.Tensor], residuals: Sequence[torch.Tensor],
                 norm_weight: torch.Tensor, *, outs=None, skip_publish: Sequence[int] = ()):
        """Run every rank; returns a list of ``(norm_out, residual_out)``.

        ``xs``: one ``[M, hidden]`` tensor or :class:`MoEOutput` per rank;
        ``residuals[r]`` (and ``outs[r]``): ``[M, hidden]``, or in owner mode
        rank r's owned rows ``[ceil(M / tp), hidden]``.
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
        (m,) = ms
        self._fork_join(
            lambda rank, stream: rank.publish(xs[rank.rank], stream=stream),
            lambda rank, stream: rank.consume(residuals[rank.rank], norm_weight,
                                              outs[rank.rank], stream=stream, tokens=m),
            [*_moe_tensors(xs), *residuals, norm_weight, *(o for pair in outs for o in pair)],
            skip_publish)
        return outs

    def _fork_join(self, publish, consume, tensors, skip_publish) -> None:
        """Fork every rank's stream from the current one, launch the
        publishes, make every consumer wait on every publish event, launch
        the consumers, join back."""
        if any(s not in range(self.tp) for s in skip_publish):
            raise ValueError(f"skip_publish must name ranks in [0, {self.tp}), got {list(skip_publish)}")
        main = torch.cuda.current_stream(self.device)
        start = torch.cuda.Event()
        start.record(main)
        published = []
        for rank, stream in zip(self.ranks, self._streams):
            stream.wait_event(start)
            if rank.rank not in skip_publish:
                publish(rank, stream)
            ev = torch.cuda.Event()
            ev.record(stream)
            published.append(ev)
        for rank, stream in zip(self.ranks, self._streams):
            for ev in published:
                stream.wait_event(ev)
            consume(rank, stream)
        for stream in self._streams:
            done = torch.cuda.Event()
            done.record(stream)
            main.wait_event(done)
        if not torch.cuda.is_current_stream_capturing():
            for t in tensors:
                for stream in self._streams:
                    t.record_stream(stream)

    def prepare_embedding(self, weights: Sequence[torch.Tensor], starts: Sequence[int],
                          rows: Sequence[int] | None = None, eps: float | None = None) -> None:
        """Every rank's :meth:`AllReduceNorm.prepare_embedding` (its shard)."""
        if len(weights) != self.tp or len(starts) != self.tp:
            raise ValueError(f"weights and starts must hold tp={self.tp} entries, "
                             f"got {len(weights)} and {len(starts)}")
        for i, r in enumerate(self.ranks):
            r.prepare_embedding(weights[i], starts[i], None if rows is None else rows[i], eps)

    def embed_norm(self, ids: torch.Tensor, positions: torch.Tensor, previous: torch.Tensor,
                   weights: Sequence[torch.Tensor], enorm: torch.Tensor, hnorm: torch.Tensor,
                   *, outs: Sequence[torch.Tensor] | None = None,
                   skip_publish: Sequence[int] = ()) -> list[torch.Tensor]:
        """Every rank's :meth:`AllReduceNorm.embed_norm` (the same ids,
        positions and previous on every rank, ``weights[r]`` rank r's shard);
        returns one ``[M, 2 * hidden]`` output per rank."""
        if len(weights) != self.tp:
            raise ValueError(f"weights must hold tp={self.tp} shards, got {len(weights)}")
        if outs is not None and len(outs) != self.tp:
            raise ValueError(f"outs must hold tp={self.tp} tensors, got {len(outs)}")
        m = {r.validate_embedding(ids, positions, previous, weights[i], enorm, hnorm,
                                  None if outs is None else outs[i])
             for i, r in enumerate(self.ranks)}.pop()
        if outs is None:
            outs = [torch.empty(m, 2 * self.hidden_size, dtype=torch.bfloat16,
                                device=previous.device) for _ in range(self.tp)]
        self._fork_join(
            lambda rank, stream: rank.publish_embedding(ids, weights[rank.rank], stream=stream),
            lambda rank, stream: rank.consume_embedding(positions, previous, weights[rank.rank],
                                                        enorm, hnorm, outs[rank.rank],
                                                        stream=stream),
            [ids, positions, previous, *weights, enorm, hnorm, *outs], skip_publish)
        return list(outs)

    def errors(self) -> list[RankErrors]:
        torch.cuda.synchronize(self.device)
        return [r.errors() for r in self.ranks]

    def diagnose(self) -> GroupDiagnosis:
        """The group view of every rank's error buffer (synchronizes)."""
        return diagnose_errors(self.errors())

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
