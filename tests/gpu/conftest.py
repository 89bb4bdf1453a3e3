"""GPU tests: streams of virtual ranks need more hardware queues than the
default 8; this must be set before CUDA creates its context."""

import os

os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")
