"""Benchmark commands (``python -m benchmarks.<name>``): tables printed for
people, timed through the one harness (:mod:`cluster.measure`). The rows
the dashboards read come from ``python -m jobs profile``, which times the
same workloads."""


def int_list(text: str) -> list[int]:
    """``"1,8,16"`` -> ``[1, 8, 16]`` (argparse type)."""
    return [int(t) for t in text.split(",") if t]
