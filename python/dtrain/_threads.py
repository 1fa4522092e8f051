"""How many threads torch and OpenBLAS run in a worker, given the cores it may use.

torch sizes its thread pool by the machine's cores, and so does OpenBLAS (Debian's torch does its
matrix products there). In a pod or container with a CPU limit that many threads are throttled in
turn; on a host whose cores are shared by several workers they take each other's cores. OpenBLAS's
idle threads also spin: the MNIST example, 2 ranks on 2 cores, spent 42% of the CPU in their
`sched_yield` and trained at a third of the rate (docs/performance.md). So unless the user chose a
count (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS), each keeps to the usable cores divided among the
workers of this host, as the launcher reports them: torchrun sets OMP_NUM_THREADS=1 for the same
reason.
"""

import ctypes
import os

import torch


def local_workers() -> int:
    """The workers on this host, as dtrain launch (DTRAIN_LOCAL_WORKERS, in every mode), horovodrun
    (HOROVOD_LOCAL_SIZE), mpirun (OMPI_COMM_WORLD_LOCAL_SIZE) or torchrun (LOCAL_WORLD_SIZE) report
    them; 1 if none does."""
    for name in ("DTRAIN_LOCAL_WORKERS", "HOROVOD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE",
                 "LOCAL_WORLD_SIZE"):
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) >= 1:
            return int(value)
    return 1


def _loaded_openblas() -> "ctypes.CDLL | None":
    """The OpenBLAS this process has loaded (through torch), or None."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            library = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_NOW)
        except OSError:
            continue
        if hasattr(library, "openblas_set_num_threads") and hasattr(
                library, "openblas_get_num_threads"):
            return library
    return None


def fit(usable_cores: int) -> None:
    share = max(1, usable_cores // local_workers())
    if not os.environ.get("OMP_NUM_THREADS") and share < torch.get_num_threads():
        torch.set_num_threads(share)
    if not os.environ.get("OPENBLAS_NUM_THREADS"):
        openblas = _loaded_openblas()
        if openblas is not None and share < openblas.openblas_get_num_threads():
            openblas.openblas_set_num_threads(share)
