"""A worker's torch and OpenBLAS threads: the usable cores shared among the workers of its host
(python/dtrain/_threads.py), unless the user chose a count."""

import subprocess
import sys

from conftest import job_env

PROBE = r"""
import ctypes, os, sys, torch
usable = -1
if sys.argv[1] == "dtrain":
    import dtrain
    usable = dtrain._dtrain.usable_cores()
blas = -1  # no OpenBLAS in this torch
for path in sorted({line.split()[-1] for line in open("/proc/self/maps") if "openblas" in line}):
    library = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_NOW)
    if hasattr(library, "openblas_get_num_threads"):
        blas = library.openblas_get_num_threads()
        break
print(usable, torch.get_num_threads(), blas)
"""


def _probe(import_dtrain=True, **env_vars):
    """(usable cores, torch's threads, OpenBLAS's threads or -1 without OpenBLAS)."""
    env = job_env()
    for name in ("DTRAIN_LOCAL_WORKERS", "HOROVOD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE",
                 "LOCAL_WORLD_SIZE", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env.pop(name, None)
    env.update(env_vars)
    out = subprocess.run(
        [sys.executable, "-c", PROBE, "dtrain" if import_dtrain else "torch only"], env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert out.returncode == 0, out.stdout
    return tuple(map(int, out.stdout.split()[-3:]))


def test_workers_sharing_a_host_share_its_cores():
    # dtrain launch's (every mode), horovodrun's, mpirun's and torchrun's count.
    for name in ("DTRAIN_LOCAL_WORKERS", "HOROVOD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE",
                 "LOCAL_WORLD_SIZE"):
        _, torch_threads, blas_threads = _probe(**{name: "64"})
        assert torch_threads == 1, name
        assert blas_threads in (-1, 1), name


def test_a_lone_worker_keeps_what_torch_and_openblas_chose_within_the_usable_cores():
    usable = _probe()[0]
    _, torch_plain, blas_plain = _probe(import_dtrain=False)
    for env in ({}, {"HOROVOD_LOCAL_SIZE": "1"}):
        _, torch_threads, blas_threads = _probe(**env)
        assert torch_threads == min(torch_plain, usable)
        assert blas_threads == (min(blas_plain, usable) if blas_plain != -1 else -1)


def test_a_count_the_user_chose_is_kept():
    chosen = {"OMP_NUM_THREADS": "2", "OPENBLAS_NUM_THREADS": "2"}
    _, torch_plain, blas_plain = _probe(import_dtrain=False, **chosen)
    assert _probe(HOROVOD_LOCAL_SIZE="64", **chosen)[1:] == (torch_plain, blas_plain)
