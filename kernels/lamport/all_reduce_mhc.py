"""``AllReduceMHC``: Lamport all-reduce fused with DSV4.1's mHC post-mix,
collapse and RMSNorm (the seed ``all_reduce_mhc.AllReduceMHC``).

``(residual_out, layer_input) = AllReduceMHC(...)(x, residual, post, comb,
pre, norm_weight, norm_eps)``: ``x`` is every rank's BF16 ``[M, hidden]``
TP-partial sublayer output, reduced across the group in FP32 and rounded
once to BF16 (rank order, or the tuning's rank-lane butterfly order); for
each of the ``hc`` target streams ``residual_out[:, t] = BF16(reduced *
post[t] + sum_s residual[:, s] * comb[s, t])`` and ``layer_input =
RMSNorm(BF16(sum_t residual_out[:, t] * pre[t]))``, with the exact rounding
order of :func:`kernels.reference.mhc.all_reduce_mhc` (``fma=True,
post_fma=True``; the consumer's module :mod:`kernels.lamport.mhc` spells it
out). :meth:`AllReduceMHC.finalize` does the same for a MoE output whose
routed top-k reduction is still open: the finalize publish
(:mod:`kernels.lamport.finalize_publish`, FP32 routing weights, shared
expert included, routed scaling factor 1.0 because DSV4.1's router folds it
into the weights) computes the payload inside the publish.

Placements (as :class:`kernels.lamport.all_reduce_norm.AllReduceNorm`): a
torch process group (symmetric memory; construction is collective), an
existing :class:`~kernels.lamport.mailbox.Mailbox` (CUDA IPC buffers or any
external peer table), :meth:`AllReduceMHC.virtual_ranks` (tp ranks in one
process on one GPU), or a single-rank group (no group, no mailbox).
Transports: ``unicast`` (peer table) and ``multicast`` (NVLS, behind the
gate of :func:`kernels.lamport.mailbox.multicast_decision`). Faults:
``budget_ns > 0`` compiles the watchdog consumer; :meth:`check` raises
:class:`~kernels.lamport.all_reduce_norm.LamportTimeout` naming the missing
ranks; :meth:`recover` is collective over the group.

Every argument is checked before any launch (ValueError naming the argument
and the values); route indices and mixes are not read on the host (no sync).

Unverified on a GPU: every launch of this class (the GPU tests in
``tests/gpu/test_all_reduce_mhc_gpu.py`` and ``benchmarks/all_reduce_mhc.py``
were written without device time and have not run). The publish kernels it
launches are the ones verified on the H200 with ``AllReduceNorm``.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Sequence

import torch

from kernels.moe import MoEOutput, RoutedExperts
from kernels.validation import require_choice, require_range, require_tensor, require_tp

from .all_reduce_norm import LamportGroupMember, LamportTimeout, VirtualRanks, _stream_handle
from .compile import FinalizePublishConfig, PublishConfig, cached
from .finalize_publish import (FINALIZE_THREADS, FinalizeTuning, check_finalize_options,
                               finalize_ctas_per_token)
from .mailbox import Mailbox, require_multicast
from .mhc import MHCConfig, check_hc
from .mhc_tuning import MHCTuning, check_geometry, tuning_for
from .protocol import ERR_DEFAULT_RECORDS, VEC_BF16
from .publish import TRANSPORTS, publish_ctas_per_token

__all__ = ["AllReduceMHC", "LamportTimeout", "MHCOptions", "MHCTuning", "MHCVirtualRanks"]


@dataclasses.dataclass(frozen=True)
class MHCOptions:
    hidden_size: int
    hc_mult: int
    max_num_tokens: int
    transport: str = "unicast"
    budget_ns: int = 0
    top_k: int | None = None

    def validate(self) -> None:
        """ValueError naming the option and its value; no CUDA calls."""
        h = self.hidden_size
        if isinstance(h, bool) or not isinstance(h, int) or h <= 0 or h % VEC_BF16:
            raise ValueError(f"hidden_size must be a positive multiple of {VEC_BF16}, got {h!r}")
        check_hc(self.hc_mult)
        if isinstance(self.max_num_tokens, bool) or not isinstance(self.max_num_tokens, int) \
                or self.max_num_tokens < 1:
            raise ValueError(f"max_num_tokens must be an int >= 1, got {self.max_num_tokens!r}")
        require_choice("transport", self.transport, TRANSPORTS)
        if isinstance(self.budget_ns, bool) or not isinstance(self.budget_ns, int) \
                or self.budget_ns < 0:
            raise ValueError(f"budget_ns must be an int >= 0, got {self.budget_ns!r}")
        if self.top_k is not None and (isinstance(self.top_k, bool)
                                       or not isinstance(self.top_k, int)
                                       or not 1 <= self.top_k <= FINALIZE_THREADS):
            raise ValueError(f"top_k must be None or an int in [1, {FINALIZE_THREADS}], "
                             f"got {self.top_k!r}")


# ---------------------------------------------------------------- argument checks
def validate_x(x, *, hidden: int, capacity: int, device=None, name: str = "x") -> int:
    """``x`` BF16 [M, hidden], 16-byte aligned; returns M in [1, capacity]."""
    x = require_tensor(name, x, dtype=torch.bfloat16, shape=(None, hidden), align=16,
                       device=device)
    return require_range(f"{name}.shape[0] (tokens)", x.shape[0], 1, capacity)


def validate_finalize_inputs(gemm2_permuted, expert_weights, expanded_idx_to_permuted_idx,
                             shared_output, *, hidden: int, capacity: int, top_k: int | None,
                             device=None, fragment_bytes: int = 8, prefix: str = "") -> int:
    """The finalize publish's tensors (the seed's checks, named as its
    arguments): ``shared_output`` BF16 [M, hidden], ``expert_weights`` FP32
    [M, top_k], ``expanded_idx_to_permuted_idx`` int32 [M, top_k],
    ``gemm2_permuted`` BF16 [rows, hidden]; aligned for the publish's
    ``fragment_bytes`` loads. Route values are not read (an index outside
    ``[-1, rows)`` makes the publish write NaN for that token). Returns M."""
    if top_k is None:
        raise ValueError("finalize needs an AllReduceMHC constructed with top_k=...")
    p = prefix
    shared = require_tensor(f"{p}shared_output", shared_output, dtype=torch.bfloat16,
                            shape=(None, hidden), align=fragment_bytes, device=device)
    m = require_range(f"{p}shared_output.shape[0] (tokens)", shared.shape[0], 1, capacity)
    require_tensor(f"{p}expert_weights", expert_weights, dtype=torch.float32,
                   shape=(m, top_k), align=4, device=device)
    require_tensor(f"{p}expanded_idx_to_permuted_idx", expanded_idx_to_permuted_idx,
                   dtype=torch.int32, shape=(m, top_k), align=4, device=device)
    gemm2 = require_tensor(f"{p}gemm2_permuted", gemm2_permuted, dtype=torch.bfloat16,
                           shape=(None, hidden), align=fragment_bytes, device=device)
    if gemm2.shape[0] >= 2**31:
        raise ValueError(f"{p}gemm2_permuted has {gemm2.shape[0]} rows, at most 2^31-1")
    return m


def validate_norm_eps(norm_eps) -> float:
    if isinstance(norm_eps, bool) or not isinstance(norm_eps, numbers.Real) \
            or not math.isfinite(float(norm_eps)) or not float(norm_eps) > 0:
        raise ValueError(f"norm_eps must be a finite real > 0, got {norm_eps!r}")
    return float(norm_eps)


def validate_mix_inputs(residual, post, comb, pre, norm_weight, norm_eps, out=None, *,
                        m: int, hidden: int, hc: int, device=None) -> float:
    """The mHC consumer's tensors for M tokens (ValueError naming the
    argument and the values); returns ``norm_eps`` as a float."""
    require_tensor("residual", residual, dtype=torch.bfloat16, shape=(m, hc, hidden),
                   align=16, device=device)
    require_tensor("post", post, dtype=torch.float32, align=4, device=device)
    if tuple(post.shape) not in ((m, hc), (m, hc, 1)):
        raise ValueError(f"post must have shape [{m}, {hc}] or [{m}, {hc}, 1], got "
                         f"{post.dtype}{list(post.shape)}")
    require_tensor("comb", comb, dtype=torch.float32, shape=(m, hc, hc), align=4,
                   device=device)
    require_tensor("pre", pre, dtype=torch.float32, shape=(m, hc), align=4, device=device)
    require_tensor("norm_weight", norm_weight, dtype=torch.bfloat16, shape=(hidden,),
                   align=16, device=device)
    eps = validate_norm_eps(norm_eps)
    if out is not None:
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise ValueError(f"out must be a (residual_out, layer_input) pair, got {out!r:.80}")
        require_tensor("out[0] (residual_out)", out[0], dtype=torch.bfloat16,
                       shape=(m, hc, hidden), align=16, device=device)
        require_tensor("out[1] (layer_input)", out[1], dtype=torch.bfloat16,
                       shape=(m, hidden), align=16, device=device)
    return eps


def _tp_of(group, mailbox) -> int:
    if mailbox is not None:
        return mailbox.tp
    if group is not None:
        import torch.distributed as dist

        return dist.get_world_size(group)
    return 1


# ---------------------------------------------------------------- one rank
class AllReduceMHC(LamportGroupMember):
    """One rank of a Lamport all-reduce + mHC + RMSNorm group (module doc).

    ``tuning``: the consumer's launch (:class:`MHCTuning`); None picks
    :func:`kernels.lamport.mhc_tuning.tuning_for` ``(hidden, tp, arch)``.
    ``finalize_tuning``: the finalize publish's (default: the seed's 8-byte
    fragments, all top_k rows prefetched, shared expert after the PDL wait).
    """

    def __init__(self, *, hidden_size: int, hc_mult: int, max_num_tokens: int,
                 top_k: int | None = None, transport: str = "unicast", budget_ns: int = 0,
                 group=None, mailbox: Mailbox | None = None, device=None,
                 allow_multicast: bool = False, error_records: int = ERR_DEFAULT_RECORDS,
                 tuning: MHCTuning | None = None,
                 finalize_tuning: FinalizeTuning | None = None) -> None:
        self.options = MHCOptions(hidden_size, hc_mult, max_num_tokens, transport,
                                  budget_ns, top_k)
        self.options.validate()
        tp = _tp_of(group, mailbox)
        tuning = tuning_for(hidden_size, tp) if tuning is None else tuning
        if not isinstance(tuning, MHCTuning):
            raise ValueError(f"tuning must be an MHCTuning, got {type(tuning).__name__}")
        tuning.validate(hidden=hidden_size, tp=tp)
        finalize_tuning = FinalizeTuning() if finalize_tuning is None else finalize_tuning
        if top_k is not None:
            finalize_tuning.validate(top_k)
            check_finalize_options(
                tp=tp, top_k=top_k, elements_per_thread=finalize_tuning.elements_per_thread,
                routed_scaling_factor=1.0, shared="after",
                prefetch_group=finalize_tuning.prefetch_group or top_k, transport=transport)
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
        self._group = group
        self._mailbox = mailbox
        self.tp, self.rank, self.device = mailbox.tp, mailbox.rank, mailbox.device
        self.hidden_size, self.hc_mult, self.capacity = hidden_size, hc_mult, max_num_tokens
        self.top_k, self.transport, self.budget_ns = top_k, transport, int(budget_ns)
        self.tuning, self.finalize_tuning = tuning, finalize_tuning
        if transport == "multicast":
            self._destination = require_multicast(opt_in=allow_multicast,
                                                  multicast_ptr=mailbox.multicast_ptr)
        else:
            self._destination = mailbox.peer_table_ptr
        self._publish = cached(PublishConfig(tp=self.tp, transport=transport))
        self._ctas = publish_ctas_per_token(hidden_size)
        self._consumer = cached(MHCConfig.from_tuning(
            hidden=hidden_size, tp=self.tp, hc=hc_mult, tuning=tuning,
            budget_ns=self.budget_ns))
        self._finalize = None
        if top_k is not None:
            t = finalize_tuning
            self._finalize = cached(FinalizePublishConfig(
                tp=self.tp, top_k=top_k, elements_per_thread=t.elements_per_thread,
                fp32_weights=True, routed_scaling_factor=1.0,
                shared="before" if t.load_shared_before_pdl else "after",
                prefetch_group=t.prefetch_group, transport=transport))
            self._finalize_ctas = finalize_ctas_per_token(hidden_size, t.elements_per_thread)
        self._virtual_peers = False  # set by MHCVirtualRanks for tp > 1

    @classmethod
    def virtual_ranks(cls, *, tp: int, hidden_size: int, hc_mult: int, max_num_tokens: int,
                      **kwargs) -> "MHCVirtualRanks":
        return MHCVirtualRanks(tp=tp, hidden_size=hidden_size, hc_mult=hc_mult,
                               max_num_tokens=max_num_tokens, **kwargs)

    @property
    def mailbox(self) -> Mailbox:
        return self._mailbox

    def supports(self, tokens: int) -> bool:
        return 1 <= tokens <= self.capacity

    # -- validation (no CUDA calls)
    def validate(self, x, residual, post, comb, pre, norm_weight, norm_eps, out=None,
                 *, name: str = "x") -> int:
        """Every check of :meth:`__call__`; returns M."""
        m = validate_x(x, hidden=self.hidden_size, capacity=self.capacity, device=self.device,
                       name=name)
        validate_mix_inputs(residual, post, comb, pre, norm_weight, norm_eps, out, m=m,
                            hidden=self.hidden_size, hc=self.hc_mult, device=self.device)
        return m

    def validate_finalize(self, gemm2_permuted, expert_weights, expanded_idx_to_permuted_idx,
                          shared_output, residual, post, comb, pre, norm_weight, norm_eps,
                          out=None, *, prefix: str = "") -> int:
        """Every check of :meth:`finalize`; returns M."""
        m = validate_finalize_inputs(
            gemm2_permuted, expert_weights, expanded_idx_to_permuted_idx, shared_output,
            hidden=self.hidden_size, capacity=self.capacity, top_k=self.top_k,
            device=self.device, fragment_bytes=2 * self.finalize_tuning.elements_per_thread,
            prefix=prefix)
        validate_mix_inputs(residual, post, comb, pre, norm_weight, norm_eps, out, m=m,
                            hidden=self.hidden_size, hc=self.hc_mult, device=self.device)
        return m

    # -- launches (no validation: __call__ / finalize validate)
    def publish(self, x: torch.Tensor, *, stream: torch.cuda.Stream | None = None) -> None:
        """Launch this rank's publish of ``x`` [M, hidden] on ``stream``."""
        mb = self._mailbox
        self._publish(x.data_ptr(), mb.stage_state_ptr, self._destination, mb.error_ptr,
                      self.rank, self.capacity, self.hidden_size, self._ctas, x.shape[0],
                      _stream_handle(stream))

    def publish_finalize(self, gemm2_permuted, expert_weights, expanded_idx_to_permuted_idx,
                         shared_output, *, stream: torch.cuda.Stream | None = None) -> None:
        """Launch this rank's MoE finalize publish (FP32 weights, shared expert)."""
        mb = self._mailbox
        self._finalize(gemm2_permuted.data_ptr(), expert_weights.data_ptr(),
                       expanded_idx_to_permuted_idx.data_ptr(), shared_output.data_ptr(),
                       gemm2_permuted.shape[0], mb.stage_state_ptr, self._destination,
                       mb.error_ptr, self.rank, self.capacity, self.hidden_size,
                       self._finalize_ctas, shared_output.shape[0], _stream_handle(stream))

    def consume(self, residual, post, comb, pre, norm_weight, norm_eps, out, *,
                stream: torch.cuda.Stream | None = None) -> None:
        """Launch this rank's mHC consumer into ``out = (residual_out, layer_input)``."""
        mb = self._mailbox
        residual_out, layer_input = out
        self._consumer(mb.buffer_ptr, residual.data_ptr(), post.data_ptr(), comb.data_ptr(),
                       pre.data_ptr(), norm_weight.data_ptr(), residual_out.data_ptr(),
                       layer_input.data_ptr(), mb.stage_state_ptr, mb.error_ptr,
                       self.capacity, mb.error_records, float(norm_eps), residual.shape[0],
                       _stream_handle(stream))

    def _outputs(self, residual, m, out):
        if out is not None:
            return tuple(out)
        return (torch.empty_like(residual),
                torch.empty(m, self.hidden_size, dtype=torch.bfloat16, device=residual.device))

    def _lone_rank_check(self) -> None:
        if self._virtual_peers:
            raise RuntimeError(
                f"rank {self.rank} of tp={self.tp} virtual ranks: call the MHCVirtualRanks "
                "group (one stream per rank); a lone rank's consumer would wait forever for "
                "peers queued behind it on the same stream")

    def __call__(self, x: torch.Tensor, residual: torch.Tensor, post: torch.Tensor,
                 comb: torch.Tensor, pre: torch.Tensor, norm_weight: torch.Tensor,
                 norm_eps: float, *, out=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (post-mixed residual streams [M, hc, H], layer input [M, H]).

        Args:
            x: [M, hidden] BF16 TP-partial sublayer output.
            residual: [M, hc, hidden] BF16 residual streams.
            post: [M, hc(, 1)] FP32 post-mix.
            comb: [M, hc, hc] FP32 residual mix, indexed [source, target].
            pre: [M, hc] FP32 carried pre-mix for the collapse.
            norm_weight: [hidden] BF16 RMSNorm weight.
            norm_eps: RMSNorm epsilon.
            out: optional preallocated (residual_out, layer_input) (pass it
                when capturing a CUDA graph).
        """
        self._lone_rank_check()
        m = self.validate(x, residual, post, comb, pre, norm_weight, norm_eps, out)
        out = self._outputs(residual, m, out)
        self.publish(x)
        self.consume(residual, post, comb, pre, norm_weight, norm_eps, out)
        return out

    def finalize(self, gemm2_permuted: torch.Tensor, expert_weights: torch.Tensor,
                 expanded_idx_to_permuted_idx: torch.Tensor, shared_output: torch.Tensor,
                 residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
                 pre: torch.Tensor, norm_weight: torch.Tensor, norm_eps: float, *,
                 out=None) -> tuple[torch.Tensor, torch.Tensor]:
        """``__call__`` for a MoE output left unfinalized.

        Args:
            gemm2_permuted: [rows, hidden] BF16 unweighted GEMM2 output in the
                MoE's permuted order.
            expert_weights: [M, top_k] FP32 routing weights, already scaled.
            expanded_idx_to_permuted_idx: [M, top_k] int32 row of each route,
                -1 for an expert this rank does not hold.
            shared_output: [M, hidden] BF16 TP-partial shared-expert output.
            residual, post, comb, pre, norm_weight, norm_eps, out: as
                :meth:`__call__`.
        """
        self._lone_rank_check()
        m = self.validate_finalize(gemm2_permuted, expert_weights, expanded_idx_to_permuted_idx,
                                   shared_output, residual, post, comb, pre, norm_weight,
                                   norm_eps, out)
        out = self._outputs(residual, m, out)
        self.publish_finalize(gemm2_permuted, expert_weights, expanded_idx_to_permuted_idx,
                              shared_output)
        self.consume(residual, post, comb, pre, norm_weight, norm_eps, out)
        return out


# ---------------------------------------------------------------- virtual ranks
def _per_rank(name: str, value, tp: int) -> list:
    """One tensor shared by every rank, or a sequence of tp tensors."""
    if isinstance(value, torch.Tensor):
        return [value] * tp
    if isinstance(value, (list, tuple)) and len(value) == tp:
        return list(value)
    raise ValueError(f"{name} must be a tensor or a sequence of tp={tp} tensors, "
                     f"got {type(value).__name__}"
                     + (f" of length {len(value)}" if isinstance(value, (list, tuple)) else ""))


class MHCVirtualRanks(VirtualRanks):
    """tp :class:`AllReduceMHC` ranks in one process on one GPU, one stream
    each (the :class:`~kernels.lamport.all_reduce_norm.VirtualRanks`
    harness: every consumer waits on every rank's publish event; capturable
    in a CUDA graph; ``errors`` / ``diagnose`` / ``check`` /
    ``is_all_sentinel`` / ``recover`` as there). The mixes, residual streams
    and norm weight may be one tensor for all ranks (they are replicated
    across TP) or one per rank."""

    def __init__(self, *, tp: int, hidden_size: int, hc_mult: int, max_num_tokens: int,
                 top_k: int | None = None, transport: str = "unicast", budget_ns: int = 0,
                 device=None, error_records: int = ERR_DEFAULT_RECORDS,
                 tuning: MHCTuning | None = None,
                 finalize_tuning: FinalizeTuning | None = None) -> None:
        if transport != "unicast":
            raise ValueError(f"virtual ranks support transport='unicast' only, got {transport!r}")
        MHCOptions(hidden_size, hc_mult, max_num_tokens, transport, budget_ns,
                   top_k).validate()
        require_tp("tp", tp)
        tuning = tuning_for(hidden_size, tp) if tuning is None else tuning
        check_geometry(hidden=hidden_size, tp=tp, cluster_size=tuning.cluster_size,
                       threads=tuning.threads, rank_lanes=tuning.rank_lanes)
        boxes = Mailbox.virtual_ranks(tp=tp, capacity=max_num_tokens, hidden=hidden_size,
                                      device=device, error_records=error_records)
        self.ranks = [AllReduceMHC(hidden_size=hidden_size, hc_mult=hc_mult,
                                   max_num_tokens=max_num_tokens, top_k=top_k,
                                   transport=transport, budget_ns=budget_ns, mailbox=b,
                                   tuning=tuning, finalize_tuning=finalize_tuning)
                      for b in boxes]
        for r in self.ranks:
            r._virtual_peers = tp > 1
        self.tp, self.device = tp, boxes[0].device
        self.capacity, self.hidden_size, self.hc_mult = max_num_tokens, hidden_size, hc_mult
        self.tuning = tuning
        self._streams = [torch.cuda.Stream(device=self.device) for _ in range(tp)]

    def _mix_args(self, residual, post, comb, pre, norm_weight):
        return [_per_rank(n, v, self.tp) for n, v in (
            ("residual", residual), ("post", post), ("comb", comb), ("pre", pre),
            ("norm_weight", norm_weight))]

    def _outs(self, outs, m, res):
        if outs is None:
            return [self.ranks[0]._outputs(res[i], m, None) for i in range(self.tp)]
        if len(outs) != self.tp:
            raise ValueError(f"outs must hold tp={self.tp} pairs, got {len(outs)}")
        return [tuple(o) for o in outs]

    def __call__(self, xs: Sequence[torch.Tensor], residual, post, comb, pre, norm_weight,
                 norm_eps: float, *, outs=None, skip_publish: Sequence[int] = ()):
        """Every rank's :meth:`AllReduceMHC.__call__`; returns a list of
        ``(residual_out, layer_input)``. ``skip_publish``: ranks whose publish
        is not launched (fault injection; use a watchdog variant)."""
        if len(xs) != self.tp:
            raise ValueError(f"xs must hold tp={self.tp} tensors, got {len(xs)}")
        res, po, co, pr, nw = self._mix_args(residual, post, comb, pre, norm_weight)
        ms = {r.validate(xs[i], res[i], po[i], co[i], pr[i], nw[i], norm_eps,
                         None if outs is None else outs[i], name=f"xs[{i}]")
              for i, r in enumerate(self.ranks)}
        if len(ms) != 1:
            raise ValueError(f"every rank must pass the same token count, got {sorted(ms)}")
        outs = self._outs(outs, ms.pop(), res)
        self._fork_join(
            lambda rank, stream: rank.publish(xs[rank.rank], stream=stream),
            lambda rank, stream: rank.consume(res[rank.rank], po[rank.rank], co[rank.rank],
                                              pr[rank.rank], nw[rank.rank], norm_eps,
                                              outs[rank.rank], stream=stream),
            [*xs, *res, *po, *co, *pr, *nw, *(o for pair in outs for o in pair)],
            skip_publish)
        return outs

    def finalize(self, moes: Sequence[MoEOutput], residual, post, comb, pre, norm_weight,
                 norm_eps: float, *, outs=None, skip_publish: Sequence[int] = ()):
        """Every rank's :meth:`AllReduceMHC.finalize`; ``moes[r]`` is rank r's
        :class:`~kernels.moe.MoEOutput` (FP32 weights, shared output required)."""
        if len(moes) != self.tp:
            raise ValueError(f"moes must hold tp={self.tp} MoEOutputs, got {len(moes)}")
        for i, moe in enumerate(moes):
            if not isinstance(moe, MoEOutput) or not isinstance(moe.routed, RoutedExperts):
                raise ValueError(f"moes[{i}] must be a MoEOutput with RoutedExperts, "
                                 f"got {type(moe).__name__}")
        res, po, co, pr, nw = self._mix_args(residual, post, comb, pre, norm_weight)
        ms = {r.validate_finalize(moes[i].routed.gemm2_permuted, moes[i].routed.expert_weights,
                                  moes[i].routed.expanded_idx_to_permuted_idx,
                                  moes[i].shared_output, res[i], po[i], co[i], pr[i], nw[i],
                                  norm_eps, None if outs is None else outs[i],
                                  prefix=f"moes[{i}].")
              for i, r in enumerate(self.ranks)}
        if len(ms) != 1:
            raise ValueError(f"every rank must pass the same token count, got {sorted(ms)}")
        outs = self._outs(outs, ms.pop(), res)

        def publish(rank, stream):
            moe = moes[rank.rank]
            rank.publish_finalize(moe.routed.gemm2_permuted, moe.routed.expert_weights,
                                  moe.routed.expanded_idx_to_permuted_idx, moe.shared_output,
                                  stream=stream)

        self._fork_join(
            publish,
            lambda rank, stream: rank.consume(res[rank.rank], po[rank.rank], co[rank.rank],
                                              pr[rank.rank], nw[rank.rank], norm_eps,
                                              outs[rank.rank], stream=stream),
            [*(t for moe in moes for t in moe.tensors()), *res, *po, *co, *pr, *nw,
             *(o for pair in outs for o in pair)],
            skip_publish)
        return outs

    def prepare_embedding(self, *args, **kwargs):
        raise TypeError("AllReduceMHC has no embedding path (use AllReduceNorm.embed_norm)")

    embed_norm = prepare_embedding
