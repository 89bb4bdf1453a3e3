"""Public entry point: ``from kernels.all_reduce_norm import AllReduceNorm``."""

from kernels.lamport.all_reduce_norm import (AllReduceNorm, AllReduceNormOptions,
                                             LamportTimeout, VirtualRanks)
from kernels.lamport.finalize_publish import FinalizeTuning
from kernels.moe import MoEOutput, RoutedExperts

__all__ = ["AllReduceNorm", "AllReduceNormOptions", "FinalizeTuning", "LamportTimeout",
           "MoEOutput", "RoutedExperts", "VirtualRanks"]
