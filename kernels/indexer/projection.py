"""``IndexerProjection``: the indexer's input projections in one GEMV kernel,
or with :meth:`IndexerProjection.fused` also the query epilogue.

One kernel reads the concatenated ``[wk; weights_proj; kpool gate]`` rows once
and writes each part in its stock dtype (key BF16, head weights FP32, gate
BF16): products of BF16 values are exact in FP32, so only the summation order
differs from the stock GEMMs (bounded by
:func:`kernels.reference.indexer.projection_error_bound`). ``fused`` runs the
same GEMV with the fused row order and does ``indexer_query``'s work in the
same kernel (Hadamard + FP8 quant of q, head-weight scaling, head padding,
key LayerNorm); its outputs equal ``__call__`` with the fused tactic followed
by the reference query epilogue (bit for bit except the key, 1 BF16 ULP).

Every argument is checked before anything is launched (ValueError naming the
argument and the values). Calls are CUDA-graph capturable.
"""

from __future__ import annotations

import math

import torch

from kernels.validation import require_tensor

from .compile import FusedConfig, ProjectionConfig, cached
from .layout import (DIM, FUSED_PARTIAL_SLOTS, FUSED_WARPS, MAILBOX_SENTINEL, MAX_SMEM_BYTES, ROWS,
                     FusedVariant, Tactic, TacticTable, check_projection_shape, fused_layout,
                     fused_smem_bytes, key_first_layout, slot_codes, spread_layout,
                     tactic_table)

#: Largest mbarrier transaction count (PTX: 2^20 - 1 bytes).
_MAX_TX_BYTES = (1 << 20) - 1


def device_arch(device: torch.device | None = None) -> str:
    """``sm_XY`` of a CUDA device (the tactic tables' key)."""
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


def _stream_handle():
    import cuda.bindings.driver as cuda

    return cuda.CUstream(torch.cuda.current_stream().cuda_stream)


def fused_max_tokens(key: int) -> int:
    """Largest token count the fused kernel's shared memory (sized for its
    largest variant) and mbarrier transaction count allow for a ``key``-wide
    key."""
    m = 1
    while (fused_smem_bytes(m + 1, FUSED_PARTIAL_SLOTS, key) <= MAX_SMEM_BYTES
           and key // ROWS * (m + 1) * 8 <= _MAX_TX_BYTES):
        m += 1
    return m


def max_active_clusters(compiled, *, cluster: int, threads: int, smem_bytes: int) -> int:
    """``cuOccupancyMaxActiveClusters`` of a compiled CuTe DSL kernel for
    clusters of ``cluster`` CTAs, after opting the function in to
    non-portable cluster sizes (more than 8 CTAs; the H200's limit with the
    opt-in is 16) and to ``smem_bytes`` of dynamic shared memory. Call after
    the kernel ran once (its module is loaded then)."""
    import cuda.bindings.driver as drv

    def ok(result):
        err, *rest = result
        if err != drv.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cluster occupancy query failed: {err}")
        return rest[0] if rest else None

    # The CUfunction of the kernel in the library the DSL loaded (CuTe DSL
    # 4.8.1 loads one context-free cudaLibrary per compile; the runtime and
    # driver library handles are the same object).
    names = list(getattr(compiled, "kernel_info", {}) or {})
    if len(names) != 1:
        raise RuntimeError(f"expected one kernel in the compiled module, got {names}")
    library = drv.CUlibrary(int(compiled.library))
    func = ok(drv.cuKernelGetFunction(ok(drv.cuLibraryGetKernel(library, names[0].encode()))))
    attr = drv.CUfunction_attribute
    ok(drv.cuFuncSetAttribute(func, attr.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1))
    ok(drv.cuFuncSetAttribute(func, attr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                              smem_bytes))
    config = drv.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = cluster, 1, 1
    config.blockDimX, config.blockDimY, config.blockDimZ = threads, 1, 1
    config.sharedMemBytes = smem_bytes
    launch = drv.CUlaunchAttribute()
    launch.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    launch.value.clusterDim.x, launch.value.clusterDim.y, launch.value.clusterDim.z = cluster, 1, 1
    config.attrs = [launch]
    config.numAttrs = 1
    return int(ok(drv.cuOccupancyMaxActiveClusters(func, config)))


class IndexerProjection:
    """(key BF16, head weights FP32, kpool gate BF16) of the layer input, or
    with :meth:`fused` also the query epilogue of ``indexer_query``.

    ``indexer`` holds ``head_dim`` (key width), ``n_head``,
    ``wk_weights_proj.weight`` (BF16 ``[key + heads, K]``: wk rows then
    weights_proj rows) and ``index_kpool_compress_gate`` (BF16 ``[gate, K]``).
    The weights are copied (concatenated, and reordered for ``fused``) here:
    rebuild the projection after changing them. ``arch`` picks the tactic
    table (default: the weights' device).

    The ``spread`` fused variants read the concatenated weight in their own
    layouts (:func:`~kernels.indexer.layout.spread_layout`,
    :func:`~kernels.indexer.layout.key_first_layout`) and exchange the
    key through ``key_mailbox`` (int32 ``[fused_max_tokens * key]``, every
    word the sentinel between calls): calls of one projection must not run
    concurrently (one stream, or graphs replayed in order), as for any
    kernel writing the same outputs.
    """

    def __init__(self, indexer, *, arch: str | None = None) -> None:
        self.key = int(indexer.head_dim)
        self.heads = int(indexer.n_head)
        wkw = _param(indexer.wk_weights_proj.weight)
        gate = _param(indexer.index_kpool_compress_gate)
        require_tensor("wk_weights_proj.weight", wkw, dtype=torch.bfloat16,
                       shape=(self.key + self.heads, None))
        require_tensor("index_kpool_compress_gate", gate, dtype=torch.bfloat16,
                       shape=(None, wkw.shape[1]), device=wkw.device)
        self.gate = gate.shape[0]
        self.k = wkw.shape[1]
        check_projection_shape(self.key, self.heads, self.gate, self.k)
        self.device = wkw.device
        self.arch = arch or (device_arch(self.device) if self.device.type == "cuda" else "sm_90")
        self.table: TacticTable = tactic_table(self.arch)
        self.weight = torch.cat([wkw, gate]).contiguous()
        order, self.first_head = fused_layout(self.key, self.heads, self.gate)
        source = torch.tensor([max(r, 0) for r in order], device=self.device)
        self.fused_weight = self.weight[source].contiguous()
        self.fused_weight[torch.tensor(order, device=self.device) < 0] = 0
        self.slots = torch.tensor(slot_codes(order, self.key, self.heads), dtype=torch.int32,
                                  device=self.device)
        self.fused_ctas = len(order) // ROWS
        self.fused_max_tokens = fused_max_tokens(self.key)
        spread, self.spread_first_head = spread_layout(self.key, self.heads, self.gate)
        self.spread_slots = torch.tensor(slot_codes(spread, self.key, self.heads),
                                         dtype=torch.int32, device=self.device)
        self.spread_ctas = len(spread) // ROWS
        #: The key-first layout's slot codes, None where its rows do not fit
        #: (``FusedConfig.validate`` refuses the variant there).
        self.key_first_slots = None
        try:
            first_order, _ = key_first_layout(self.key, self.heads, self.gate)
        except ValueError:
            pass
        else:
            self.key_first_slots = torch.tensor(slot_codes(first_order, self.key, self.heads),
                                                dtype=torch.int32, device=self.device)
        self.key_mailbox = torch.full((self.fused_max_tokens * self.key,),
                                      MAILBOX_SENTINEL - (1 << 32), dtype=torch.int32,
                                      device=self.device)
        #: FusedConfig -> max active key clusters (occupancy query, first call).
        self.cluster_occupancy: dict = {}

    @property
    def rows(self) -> int:
        return self.key + self.heads + self.gate

    # ------------------------------------------------------------ validation
    def _check_x(self, x) -> int:
        require_tensor("x", x, dtype=torch.bfloat16, shape=(None, self.k), align=16,
                       device=self.device)
        m = x.shape[0]
        if m < 1:
            raise ValueError(f"x must hold at least one token, got shape {list(x.shape)}")
        return m

    def tactic_for(self, tokens: int) -> Tactic:
        """The tactic table's entry for ``tokens`` (ValueError outside it)."""
        return self.table.lookup(tokens, k=self.k, heads=self.heads)

    def fused_variant_for(self, tokens: int) -> FusedVariant:
        """The table's fused variant for this K, head count and ``tokens``."""
        return self.table.fused_variant_for(self.k, self.heads, tokens)

    def fused_tactic(self, tokens: int, variant: FusedVariant | None = None) -> Tactic:
        """The projection tactic whose bits :meth:`fused` at ``tokens`` (with
        ``variant``, default the table's) reproduces: the reference's input."""
        return (variant or self.fused_variant_for(tokens)).tactic(self.key)

    def validate(self, x, *, tactic: Tactic | None = None, out=None) -> tuple[int, Tactic]:
        """All checks of :meth:`__call__`; returns (M, tactic)."""
        m = self._check_x(x)
        if tactic is None:
            tactic = self.tactic_for(m)
        elif not isinstance(tactic, Tactic):
            raise ValueError(f"tactic must be a Tactic or None, got {tactic!r}")
        try:
            tactic.span(self.k)
        except ValueError as err:
            raise ValueError(f"indexer projection rows or K do not tile: {err}") from None
        if tactic.smem_bytes(m) > MAX_SMEM_BYTES:
            raise ValueError(f"{tactic} at {m} tokens needs {tactic.smem_bytes(m)} B of shared "
                             f"memory, more than {MAX_SMEM_BYTES}")
        if out is not None:
            _check_out(out, (("out[0] (key)", torch.bfloat16, (m, self.key)),
                             ("out[1] (weights)", torch.float32, (m, self.heads)),
                             ("out[2] (gate)", torch.bfloat16, (m, self.gate))), self.device)
        return m, tactic

    def validate_fused(self, x, q, norm_weight, norm_bias, eps, scale, padded, weights_dtype,
                       out=None) -> int:
        """All checks of :meth:`fused`; returns M."""
        m = self._check_x(x)
        if m > self.fused_max_tokens:
            raise ValueError(f"the fused kernel takes at most {self.fused_max_tokens} tokens "
                             f"(shared memory), got {m}")
        require_tensor("q", q, dtype=torch.bfloat16, align=16, device=self.device)
        if tuple(q.shape) not in ((m, self.heads, DIM), (m, self.heads * DIM)):
            raise ValueError(f"q must have shape [{m}, {self.heads}, {DIM}] or "
                             f"[{m}, {self.heads * DIM}], got {list(q.shape)}")
        for name, t in (("norm.weight", norm_weight), ("norm.bias", norm_bias)):
            require_tensor(name, t, dtype=torch.float32, shape=(self.key,), device=self.device)
        for name, v in (("eps", eps), ("scale", scale)):
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a positive finite number, got {v!r}")
        if not isinstance(padded, int) or isinstance(padded, bool) or padded < self.heads:
            raise ValueError(f"padded must be an int >= heads = {self.heads}, got {padded!r}")
        if weights_dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"weights_dtype must be torch.float32 or torch.bfloat16, "
                             f"got {weights_dtype}")
        if out is not None:
            _check_out(out, (("out[0] (q_fp8)", torch.float8_e4m3fn, (m, padded, DIM)),
                             ("out[1] (weights)", weights_dtype, (m, padded)),
                             ("out[2] (key)", torch.bfloat16, (m, self.key)),
                             ("out[3] (gate)", torch.bfloat16, (m, self.gate))), self.device)
        return m

    # ------------------------------------------------------------ launches
    def __call__(self, x: torch.Tensor, *, tactic: Tactic | None = None, out=None,
                 early_launch: bool = False):
        """``(key BF16 [M, key], head weights FP32 [M, heads], gate BF16 [M,
        gate])`` of ``x`` (BF16 ``[M, K]``); ``tactic`` overrides the table's;
        ``early_launch`` lets the next kernel launch before this one's PDL
        wait (same bits; the benchmark's sweep times both)."""
        if not isinstance(early_launch, bool):
            raise ValueError(f"early_launch must be a bool, got {early_launch!r}")
        m, tactic = self.validate(x, tactic=tactic, out=out)
        if out is None:
            out = (torch.empty((m, self.key), dtype=torch.bfloat16, device=x.device),
                   torch.empty((m, self.heads), dtype=torch.float32, device=x.device),
                   torch.empty((m, self.gate), dtype=torch.bfloat16, device=x.device))
        key, weights, gate = out
        kernel = cached(ProjectionConfig(self.key, self.heads, self.gate, self.k, m, tactic,
                                         early_launch=early_launch))
        kernel(self.weight.data_ptr(), x.data_ptr(), key.data_ptr(), weights.data_ptr(),
               gate.data_ptr(), _stream_handle())
        return key, weights, gate

    def fused(self, x: torch.Tensor, q: torch.Tensor, norm, scale: float, padded: int,
              weights_dtype: torch.dtype = torch.float32, *, ue8m0: bool = True, out=None,
              variant: FusedVariant | None = None):
        """``(q_fp8 [M, padded, 128] e4m3, scaled head weights [M, padded],
        normed key [M, key] BF16, kpool gate [M, gate] BF16)``, as
        ``__call__`` with the fused tactic followed by ``indexer_query``.
        ``norm`` has ``weight``, ``bias`` (FP32 ``[key]``) and ``eps``.
        ``variant`` (default: the table's for this K, head count and token
        count, :meth:`~kernels.indexer.layout.TacticTable.fused_variant_for`)
        picks how the kernel loads and splits; the outputs equal the
        projection at ``variant.tactic()`` plus the reference epilogue."""
        if variant is not None and not isinstance(variant, FusedVariant):
            raise ValueError(f"variant must be a FusedVariant or None, got {variant!r}")
        eps = float(norm.eps)
        m = self.validate_fused(x, q, _param(norm.weight), _param(norm.bias), eps, scale,
                                padded, weights_dtype, out)
        if variant is None:
            variant = self.fused_variant_for(m)
        config = FusedConfig(self.key, self.heads, self.gate, self.k, m, padded,
                             weights_dtype == torch.bfloat16, bool(ue8m0), variant=variant)
        config.validate()
        dev = x.device
        if out is None:
            out = (torch.empty((m, padded, DIM), dtype=torch.float8_e4m3fn, device=dev),
                   torch.empty((m, padded), dtype=weights_dtype, device=dev),
                   torch.empty((m, self.key), dtype=torch.bfloat16, device=dev),
                   torch.empty((m, self.gate), dtype=torch.bfloat16, device=dev))
        q_out, w_out, key, gate = out
        kernel = cached(config)
        refused = self.cluster_occupancy.get(("refused", config))
        if refused:
            raise RuntimeError(refused)
        first = config not in self.cluster_occupancy
        if variant.key_first:
            weight, slots = self.weight, self.key_first_slots
        elif variant.spread:
            weight, slots = self.weight, self.spread_slots
        else:
            weight, slots = self.fused_weight, self.slots
        kernel(weight.data_ptr(), x.data_ptr(), gate.data_ptr(), q.data_ptr(),
               q_out.data_ptr(), w_out.data_ptr(), key.data_ptr(),
               _param(norm.weight).data_ptr(), _param(norm.bias).data_ptr(),
               slots.data_ptr(), self.key_mailbox.data_ptr(), float(scale), eps,
               _stream_handle())
        if first:
            self._check_schedulable(config, kernel)
        return q_out, w_out, key, gate

    def _check_schedulable(self, config: FusedConfig, kernel) -> None:
        """The key cluster is ``key / 8`` = 16 CTAs of 512 threads: on sm_90
        a non-portable cluster size. CuTe DSL opts every kernel in
        (``CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED``); this sets it
        again explicitly and asks the occupancy API how many such clusters
        fit at once (recorded in ``cluster_occupancy``). Zero means the launch
        cannot be scheduled: later calls raise RuntimeError (the first launch
        has already failed with a CUDA error then). The spread variant has
        no clusters: the query counts CTAs of it that fit at once."""
        cluster = 1 if config.variant.spread else self.key // ROWS
        smem = config.smem_bytes()
        try:
            n = max_active_clusters(kernel, cluster=cluster, threads=32 * FUSED_WARPS,
                                    smem_bytes=smem)
        except Exception as exc:  # the query itself failed: record, do not block
            self.cluster_occupancy[config] = None
            self.cluster_occupancy[("error", config)] = f"{type(exc).__name__}: {exc}"
            return
        self.cluster_occupancy[config] = n
        if n < 1:
            self.cluster_occupancy[("refused", config)] = (
                f"the fused kernel's {cluster}-CTA cluster ({32 * FUSED_WARPS} threads, {smem} B "
                f"shared memory a CTA) cannot be scheduled on this GPU (0 active clusters)")
            raise RuntimeError(self.cluster_occupancy[("refused", config)])


def _param(t):
    return t.data if isinstance(t, torch.nn.Parameter) else t


def _check_out(out, specs, device) -> None:
    if not isinstance(out, (tuple, list)) or len(out) != len(specs):
        raise ValueError(f"out must be a tuple of {len(specs)} tensors "
                         f"({', '.join(s[0] for s in specs)}), got {type(out).__name__}")
    for t, (name, dtype, shape) in zip(out, specs):
        require_tensor(name, t, dtype=dtype, shape=shape, align=16, device=device)
