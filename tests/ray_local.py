"""How a test starts a local Ray cluster of its own: the service's start
(:func:`jobs.embedded.init_with_retry`: a bounded retry, then one line naming
what timed out), so a raylet slow to start beside a busy neighbour ("The
current node timed out during startup") is tried again rather than failing
every test of a module, as a bare ``ray.init`` did."""

import contextlib
from collections.abc import Iterator

from jobs.embedded import init_with_retry


@contextlib.contextmanager
def local_ray_cluster(**resources: float) -> Iterator[None]:
    """A fresh local cluster (``num_cpus=``, ``num_gpus=``, ... as given) for
    the block, stopped when it ends; a cluster the process already has is
    used as it is and left running."""
    import ray
    if ray.is_initialized():
        yield
        return
    init_with_retry(lambda: ray.init(address="local", include_dashboard=False, log_to_driver=False,
                                     configure_logging=False, **resources),
                    what="the test's local Ray cluster did not start", between=ray.shutdown)
    try:
        yield
    finally:
        ray.shutdown()
