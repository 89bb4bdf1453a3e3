"""Torch references for every op of the kernel family, runnable on CPU and GPU.

One module per op; the numerical contract's helpers live in
:mod:`kernels.reference.numerics` and golden-vector handling in
:mod:`kernels.reference.golden`. References never import CuTe DSL.
"""
