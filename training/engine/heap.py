"""The C heap of a training process: what one step frees stays for the next, instead of going back to the
kernel between them.

Every step allocates and frees the same large buffers: activations, FSDP's all-gathered parameters and
unsharded gradients, the optimizer's temporaries, up to tens of MB each on the CPU. glibc's malloc takes a
block below its mmap threshold from the heap, and returns the heap's top to the kernel whenever more than
its trim threshold lies free there. By default both thresholds follow the largest block freed so far (at
most 32 and 64 MiB), so at the end of a step the heap's top can go back to the kernel, and the next step
faults the same memory in again, a page at a time, each page zeroed. On the FSDP benchmark (two ranks, two
cores) a worker faulted 35,000 to 46,000 pages a second that way, about 200 MB/s of heap returned and
taken back, and a bare FSDP loop 8,000; it is CPU time a step does not get, and which loop suffers more
depends on where long-lived blocks happen to land.

So a training process sets glibc's two thresholds itself (`mallopt`):
- blocks up to `MMAP_THRESHOLD_BYTES` come from the heap (the largest glibc would reach by itself); a larger
  one (a checkpoint's staging copy, a whole model gathered for the final save) is still mapped apart and
  returned the moment it is freed;
- the heap's top goes back to the kernel only beyond `TRIM_THRESHOLD_BYTES` free: a step's transient memory
  is kept for the next one. The resident size stays at the heap's peak, which a step had reached anyway.

Where the environment configures glibc's malloc already (GLIBC_TUNABLES' `glibc.malloc.*`, or the older
MALLOC_*_ variables), or a different allocator is preloaded in its place (jemalloc, tcmalloc), the
operator's choice stands. On a C library without `mallopt` (macOS, musl) nothing is done.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Mapping

log = logging.getLogger("retrain.heap")

# glibc's <malloc.h>
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
TRIM_THRESHOLD_BYTES = 1024 * 1024 * 1024

# Environment variables by which an operator tunes glibc's malloc, or replaces it.
_OPERATOR_MALLOC_VARIABLES = (
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_MMAP_MAX_",
    "MALLOC_ARENA_MAX",
)
_REPLACEMENTS = ("jemalloc", "tcmalloc", "mimalloc")


def keep_freed_heap(environ: Mapping[str, str]) -> bool:
    """Set glibc's malloc thresholds for training (see the module's docstring); True if they were set,
    False where the environment chose for itself or the C library is not glibc."""
    if _operator_chose(environ) or not _glibc():
        return False
    # The symbols this process already has (glibc's among them): no library search, which on Linux runs
    # ldconfig in a subprocess at every worker's start.
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # mallopt returns 1 on success. Setting either threshold also stops glibc from moving both by itself.
    mmap_set = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
    if not (mmap_set and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1):
        log.debug("glibc refused a malloc threshold (mmap threshold set: %s)", mmap_set)
        return False
    return True


def _operator_chose(environ: Mapping[str, str]) -> bool:
    if "glibc.malloc." in environ.get("GLIBC_TUNABLES", ""):
        return True
    if any(name in environ for name in _OPERATOR_MALLOC_VARIABLES):
        return True
    preload = environ.get("LD_PRELOAD", "")
    return any(name in preload for name in _REPLACEMENTS)


def _glibc() -> bool:
    try:
        return bool(os.confstr("CS_GNU_LIBC_VERSION"))
    except (OSError, ValueError):  # not a name this platform knows, or not glibc (musl)
        return False
