"""Public entry point: ``from kernels.all_reduce_mhc import AllReduceMHC``."""

from kernels.lamport.all_reduce_mhc import (AllReduceMHC, LamportTimeout, MHCOptions,
                                            MHCVirtualRanks)
from kernels.lamport.finalize_publish import FinalizeTuning
from kernels.lamport.mhc_tuning import MHCTuning, tuning_for
from kernels.moe import MoEOutput, RoutedExperts

__all__ = ["AllReduceMHC", "FinalizeTuning", "LamportTimeout", "MHCOptions", "MHCTuning",
           "MHCVirtualRanks", "MoEOutput", "RoutedExperts", "tuning_for"]
