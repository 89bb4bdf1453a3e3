"""Public entry point: ``from kernels.all_reduce_norm import AllReduceNorm``."""

from kernels.lamport.all_reduce_norm import (AllReduceNorm, AllReduceNormOptions,
                                             LamportTimeout, VirtualRanks)

__all__ = ["AllReduceNorm", "AllReduceNormOptions", "LamportTimeout", "VirtualRanks"]
