"""DSA indexer stage (seed 001): the projection GEMV and the fused query epilogue.

This package imports without CuTe DSL: :mod:`kernels.indexer.layout` holds the
constants, the tactic tables and the fused row layout shared by the kernel
host classes, the references (:mod:`kernels.reference.indexer`) and the jobs.
"""

from kernels.indexer.layout import (
    DEFAULT_ARCH,
    DIM,
    FUSED_CANDIDATES,
    FUSED_PARTIAL_SLOTS,
    FUSED_WARPS,
    GATE,
    GB300,
    H200,
    K_MULTIPLE,
    KEY,
    MAX_CLUSTER,
    MAX_SMEM_BYTES,
    MAX_TOKENS,
    MMA_K,
    MQA_MIN_HEADS,
    QUANT_BLOCK,
    ROWS,
    SLOT_GATE,
    SLOT_HEAD,
    SLOT_KEY,
    SLOT_NONE,
    TACTIC_TABLES,
    TILE,
    FuseRule,
    FusedVariant,
    Tactic,
    TacticRange,
    TacticTable,
    VariantRule,
    check_projection_shape,
    fuse,
    fused_ctas,
    fused_layout,
    fused_min_bytes,
    fused_row_live,
    fused_smem_bytes,
    fused_weight_bytes_read,
    hadamard_scale,
    head_weight_scale,
    padded_heads,
    projection_smem_bytes,
    slot_code,
    slot_codes,
    tactic,
    tactic_table,
)

__all__ = [
    "DEFAULT_ARCH", "DIM", "FUSED_CANDIDATES", "FUSED_PARTIAL_SLOTS", "FUSED_WARPS", "GATE", "GB300", "H200", "K_MULTIPLE", "KEY",
    "MAX_CLUSTER", "MAX_SMEM_BYTES", "MAX_TOKENS", "MMA_K", "MQA_MIN_HEADS", "QUANT_BLOCK",
    "ROWS", "SLOT_GATE", "SLOT_HEAD", "SLOT_KEY", "SLOT_NONE", "TACTIC_TABLES", "TILE",
    "FuseRule", "FusedVariant", "Tactic", "TacticRange", "TacticTable", "VariantRule", "check_projection_shape", "fuse",
    "fused_ctas", "fused_layout", "fused_min_bytes", "fused_row_live", "fused_smem_bytes",
    "fused_weight_bytes_read", "hadamard_scale", "head_weight_scale",
    "padded_heads", "projection_smem_bytes", "slot_code", "slot_codes", "tactic", "tactic_table",
]
