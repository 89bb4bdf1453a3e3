"""The emulated backend: the Lamport protocol in numpy over host shared
memory, one process per rank (Ray actors on CPUs), for CI without a GPU.

- :mod:`.segment`: one rank's mailbox segment (layout, header slot, lifetime);
- :mod:`.lamport`: publish and the watchdog consume;
- :mod:`.rank`: :class:`EmulatedRank`, the RankBackend a rank actor drives:
  the protocol alone, on payload bits it is given (no torch in a rank);
- :mod:`.host`: :class:`HostHalf`, the driver's part of a call (the op's
  torch payload before it, epilogue and check after it).

Results from this backend are labelled ``backend=emulated`` and say nothing
about GPU speed.
"""

from cluster.emulated.segment import (remove_driver_segments, segment_name, sweep_orphans,
                                      unlink_segment)


def __getattr__(name: str):
    """``Backend`` (= ``EmulatedRank``) on first use: the driver imports this
    package for its declarations and must not pay for the rank's imports
    (torch, the references)."""
    if name in ("Backend", "EmulatedRank"):
        from cluster.emulated.rank import EmulatedRank
        return EmulatedRank
    if name == "HostHalf":
        from cluster.emulated.host import HostHalf
        return HostHalf
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def release_rank(group_id: str, rank: int) -> None:
    """Unlink the rank's mailbox segment if it is still there."""
    unlink_segment(segment_name(group_id, rank))


__all__ = ["Backend", "EmulatedRank", "HostHalf", "release_rank", "remove_driver_segments", "sweep_orphans"]
