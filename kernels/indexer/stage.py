"""``IndexerStage``: ``Indexer.forward`` with the fused projection inside
planned steps, plus the stand-in ``Indexer`` module and the stock chain.

The engine's Indexer module is not available here, so :class:`Indexer` is a
minimal torch module holding the same parameters (``wq_b``,
``wk_weights_proj``, ``k_norm``, ``index_kpool_compress_gate``,
``index_kpool_compress_ape``, ``index_kpool``) whose stock ``forward`` is the
unfused chain the seed describes (TF32 off):

1. the key: a skinny BF16 GEMM of ``x`` by wk;
2. the head weights: an FP32 copy of the input against an FP32 copy of
   weights_proj (made once, like the engine's FP32 parameter);
3. the kpool gate: a BF16 GEMM (cuBLAS picks its split-K and reduce);
4. ``indexer_query`` as separate torch ops (:func:`stock_indexer_query`):
   key LayerNorm, Hadamard (an FP32 GEMM by the 128 x 128 Hadamard matrix:
   one kernel, standing in for ``fast_hadamard_transform``), FP8 e4m3
   quantization with power-of-two (ue8m0) scales, head-weight scaling and
   the padding to ``max(heads, MQA_MIN_HEADS)`` heads.

It then calls ``indexer_op`` (the hook receiving the outputs; the default
returns them as a dict). :class:`IndexerStage` installs itself as the
module's ``forward``: inside :func:`planned_step` it runs the fused kernel
where :func:`_fuse` says so and otherwise the two-step path (projection
kernel, then :func:`stock_indexer_query`); outside planned steps it runs the
stock forward.
"""

from __future__ import annotations

import contextlib
import threading

import torch
import torch.nn.functional as F

from .layout import DIM, fuse, padded_heads
from .projection import IndexerProjection

_planned = threading.local()


@contextlib.contextmanager
def planned_step():
    """Mark the calls inside as part of a planned decode step (the fused path)."""
    previous = getattr(_planned, "on", False)
    _planned.on = True
    try:
        yield
    finally:
        _planned.on = previous


def planned() -> bool:
    """Whether the current call is inside :func:`planned_step`."""
    return getattr(_planned, "on", False)


class _ReplicatedLinear(torch.nn.Linear):
    """``nn.Linear`` returning ``(y, None)`` as the engine's linear layers do."""

    def forward(self, x):  # noqa: D401
        return F.linear(x, self.weight), None


_HADAMARD: dict[tuple, torch.Tensor] = {}


def _hadamard(device) -> torch.Tensor:
    key = (str(device),)
    if key not in _HADAMARD:
        from kernels.reference.indexer import hadamard_matrix

        _HADAMARD[key] = hadamard_matrix(DIM).to(torch.float32).to(device)
    return _HADAMARD[key]


def _pow2_ceil(s: torch.Tensor) -> torch.Tensor:
    raw = s.view(torch.int32)
    exponent = ((raw >> 23) & 0xFF) + ((raw & 0x7FFFFF) != 0).to(torch.int32)
    return (exponent << 23).view(torch.float32)


def stock_indexer_query(q, k, weights, norm, scale: float, padded: int,
                        weights_dtype=torch.float32):
    """``(q_fp8 [M, padded, 128], head weights [M, padded], normed key [M,
    key] BF16)``: ``indexer_query`` as separate torch ops (the stock chain's
    and the two-step path's query epilogue)."""
    m, heads = weights.shape
    key = F.layer_norm(k.float(), (k.shape[1],), norm.weight, norm.bias, norm.eps)
    rotated = (q.reshape(m * heads, DIM).float() @ _hadamard(q.device)).mul_(DIM ** -0.5)
    rotated = rotated.to(torch.bfloat16).float()
    amax = rotated.abs().amax(dim=1).clamp_min_(1e-4)
    s = _pow2_ceil(amax * (1.0 / 448.0))
    q_out = torch.zeros((m, padded, DIM), dtype=torch.float8_e4m3fn, device=q.device)
    q_out[:, :heads] = (rotated / s[:, None]).clamp_(-448.0, 448.0).to(
        torch.float8_e4m3fn).view(m, heads, DIM)
    w_out = torch.zeros((m, padded), dtype=weights_dtype, device=q.device)
    w_out[:, :heads] = (weights * s.view(m, heads) * scale).to(weights_dtype)
    return q_out, w_out, key.to(torch.bfloat16)


class Indexer(torch.nn.Module):
    """A NoPE DSA indexer's parameters and its stock (unfused) forward."""

    def __init__(self, *, hidden: int, q_lora_rank: int = 1536, heads: int = 64,
                 key: int = DIM, gate: int = 128, ratio: int = 4, kpool_slots: int = 16,
                 eps: float = 1e-6, device=None, generator: torch.Generator | None = None,
                 weights_dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        if key != DIM:
            raise ValueError(f"the indexer head dim must be {DIM}, got {key}")
        self.hidden, self.head_dim, self.n_head, self.rope_dim = hidden, key, heads, 0
        self.softmax_scale = DIM ** -0.5
        self.weights_dtype = weights_dtype
        bf = dict(dtype=torch.bfloat16, device=device)
        self.wq_b = _ReplicatedLinear(q_lora_rank, heads * DIM, bias=False, **bf)
        self.wk_weights_proj = torch.nn.Linear(hidden, key + heads, bias=False, **bf)
        self.k_norm = torch.nn.LayerNorm(key, eps=eps, device=device, dtype=torch.float32)
        self.index_kpool_compress_gate = torch.nn.Parameter(torch.empty(gate, hidden, **bf))
        self.index_kpool_compress_ape = torch.nn.Parameter(torch.empty(ratio, key, **bf))
        self.register_buffer("index_kpool", torch.zeros(kpool_slots, key, **bf))
        self.reset_parameters(generator)
        self.requires_grad_(False)  # an inference module

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        g = generator or torch.Generator().manual_seed(0)
        for p, std in ((self.wq_b.weight, 0.02), (self.wk_weights_proj.weight, 0.02),
                       (self.index_kpool_compress_gate, 0.02),
                       (self.index_kpool_compress_ape, 0.02)):
            p.copy_(torch.randn(p.shape, generator=g) * std)
        self.k_norm.weight.copy_(1 + 0.1 * torch.randn(self.head_dim, generator=g))
        self.k_norm.bias.copy_(0.1 * torch.randn(self.head_dim, generator=g))
        self.refresh_fp32_copy()

    @torch.no_grad()
    def refresh_fp32_copy(self) -> None:
        """The stock path's FP32 copy of weights_proj (call after changing it)."""
        self.weights_proj_fp32 = self.wk_weights_proj.weight[self.head_dim:].float().contiguous()

    # -- the stock chain
    def stock_projection(self, x: torch.Tensor):
        """(key BF16, head weights FP32, kpool gate BF16) by three GEMMs."""
        k = F.linear(x, self.wk_weights_proj.weight[: self.head_dim])
        weights = F.linear(x.float(), self.weights_proj_fp32)
        gate = F.linear(x, self.index_kpool_compress_gate)
        return k, weights, gate

    def forward(self, hidden_states, qr, positions=None, rotary_emb=None):
        q, _ = self.wq_b(qr)
        k, weights, gate = self.stock_projection(hidden_states)
        scale = self.softmax_scale * self.n_head ** -0.5
        q_fp8, weights, k = stock_indexer_query(q, k, weights, self.k_norm, scale,
                                                padded_heads(self.n_head), self.weights_dtype)
        return self.indexer_op(hidden_states, q_fp8, k, weights, gate_score=gate,
                               compress_ape=self.index_kpool_compress_ape,
                               index_kpool=self.index_kpool, positions=positions)

    def indexer_op(self, hidden_states, q_fp8, k, weights, *, gate_score, compress_ape,
                   index_kpool, positions):
        """The hook receiving the indexer's outputs (the engine's top-k op);
        this stand-in returns them."""
        return {"q_fp8": q_fp8, "k": k, "weights": weights, "gate_score": gate_score}


def _fuse(tokens: int, heads: int, arch: str = "sm_90") -> bool:
    """Whether the query epilogue runs inside the projection kernel (the
    arch's fuse rule: only where the projection tactic is the fused one)."""
    return fuse(tokens, heads, arch)


class IndexerStage:
    """``Indexer.forward`` with the fused projection inside planned steps.

    Installed as the indexer's ``forward``; every call outside a planned step
    (and every token count beyond the tactic table) runs the stock forward.
    """

    def __init__(self, indexer: Indexer, *, weights_dtype: torch.dtype | None = None) -> None:
        if indexer.rope_dim != 0:
            raise ValueError("the fused indexer path assumes a NoPE indexer "
                             f"(rope_dim 0), got rope_dim={indexer.rope_dim}")
        self.indexer = indexer
        self.stock = indexer.forward
        self.projection = IndexerProjection(indexer)
        self.weights_dtype = weights_dtype or indexer.weights_dtype
        indexer.forward = self.forward

    def uninstall(self) -> None:
        self.indexer.forward = self.stock

    def forward(self, hidden_states, qr, positions=None, rotary_emb=None):
        tokens = hidden_states.shape[0]
        if not planned() or tokens > self.projection.table.max_tokens:
            return self.stock(hidden_states, qr, positions, rotary_emb)
        ind = self.indexer
        q, _ = ind.wq_b(qr)
        scale = ind.softmax_scale * ind.n_head ** -0.5
        padded = padded_heads(ind.n_head)
        dtype = self.weights_dtype
        if _fuse(tokens, ind.n_head, self.projection.arch):
            q_fp8, weights, k, gate_score = self.projection.fused(
                hidden_states, q, ind.k_norm, scale, padded, dtype)
        else:
            k, weights, gate_score = self.projection(hidden_states)
            q_fp8, weights, k = stock_indexer_query(q, k, weights, ind.k_norm, scale, padded,
                                                    dtype)
        return ind.indexer_op(hidden_states, q_fp8, k, weights, gate_score=gate_score,
                              compress_ape=ind.index_kpool_compress_ape,
                              index_kpool=ind.index_kpool, positions=positions)
