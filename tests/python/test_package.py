"""The package as users meet it, in both layouts the suite runs on (the build tree, or a `pip
install` when DTRAIN_TEST_INSTALLED=1): the version from one place, the commands, `python -m
dtrain`, the guard against a torch other than the one dtrain was compiled for, the type
information, and Horovod's public names at Horovod's module paths."""

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys

import torch

import dtrain
from conftest import BUILD, DTRAIN, INSTALLED, PYTHON, REPO, job_env


def run(argv, env=None, cwd="/", timeout=120):
    return subprocess.run(argv, env=env or job_env(), cwd=cwd, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)


def test_version_comes_from_cmake_project():
    with open(os.path.join(REPO, "CMakeLists.txt")) as f:
        declared = re.search(r"project\(dtrain VERSION ([0-9.]+)", f.read()).group(1)
    assert dtrain.__version__ == declared
    assert importlib.metadata.version("dtrain") == declared


def test_package_is_the_one_under_test():
    where = os.path.realpath(dtrain.__file__)
    if INSTALLED:
        assert where.startswith(os.path.realpath(sys.prefix)), (where, sys.prefix)
    else:
        assert where.startswith(os.path.realpath(os.path.join(BUILD, "python"))), where
    assert dtrain._build_info.TORCH_VERSION == torch.__version__


def test_commands_and_python_m_dtrain():
    for argv in ([DTRAIN, "--help"], [PYTHON, "-m", "dtrain", "--help"]):
        p = run(argv)
        assert p.returncode == 0 and "launch" in p.stdout, (argv, p.stdout)
    p = run([PYTHON, "-m", "dtrain", "launch", "-n", "2", "-s", "1", "--launcher", "local", "--",
             PYTHON, "-c", "import dtrain; kv = dtrain.kv.create('dist_sync'); "
             "print('member', kv.rank, 'of', kv.num_workers)"], timeout=180)
    assert p.returncode == 0, p.stdout
    assert sorted(re.findall(r"member (\d) of 2", p.stdout)) == ["0", "1"], p.stdout


def test_unknown_subcommand_is_a_usage_error():
    p = run([PYTHON, "-m", "dtrain", "no-such-command"])
    assert p.returncode == 2, p.stdout


def test_another_torch_than_the_built_one_is_refused(tmp_path):
    """A wheel built for one torch and imported beside another gives a clear ImportError instead
    of undefined symbols. Simulated with a copy of the package whose build info names another
    torch (the real extension is copied too, so nothing else differs)."""
    package = os.path.dirname(dtrain.__file__)
    copy = tmp_path / "dtrain"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("_bin", "__pycache__"))
    (copy / "_build_info.py").write_text('TORCH_VERSION = "0.0.1"\n')
    env = job_env()
    env["PYTHONPATH"] = str(tmp_path)
    p = run([PYTHON, "-c", "import dtrain"], env=env)
    assert p.returncode != 0
    assert "dtrain was built against torch 0.0.1" in p.stdout, p.stdout
    assert "pip install --no-build-isolation" in p.stdout, p.stdout


def test_package_ships_type_information():
    package = os.path.dirname(dtrain.__file__)
    assert os.path.exists(os.path.join(package, "py.typed"))
    assert os.path.exists(os.path.join(package, "_dtrain.pyi"))


# Every public name of horovod.torch (horovod/torch/__init__.py of the current release).
HOROVOD_TORCH_NAMES = """
    elastic Compression allgather_object broadcast_object broadcast_optimizer_state
    broadcast_parameters allreduce allreduce_async allreduce_ allreduce_async_ grouped_allreduce
    grouped_allreduce_async grouped_allreduce_ grouped_allreduce_async_ sparse_allreduce_async
    allgather allgather_async grouped_allgather grouped_allgather_async broadcast broadcast_async
    broadcast_ broadcast_async_ alltoall alltoall_async reducescatter reducescatter_async
    grouped_reducescatter grouped_reducescatter_async join barrier poll synchronize init shutdown
    is_initialized start_timeline stop_timeline size local_size cross_size rank local_rank
    cross_rank mpi_threads_supported mpi_enabled mpi_built gloo_enabled gloo_built nccl_built
    ddl_built ccl_built cuda_built rocm_built ProcessSet global_process_set add_process_set
    remove_process_set Average Sum Adasum Min Max Product HorovodInternalError
    DistributedOptimizer SyncBatchNorm""".split()


def test_horovods_names_and_module_paths():
    """A Horovod script imports these from horovod.torch, or from the module that defines them:
    each is at the same place under dtrain.torch."""
    import importlib

    import dtrain.torch as hvd
    missing = [name for name in HOROVOD_TORCH_NAMES if not hasattr(hvd, name)]
    assert not missing, missing
    mpi_ops = importlib.import_module("dtrain.torch.mpi_ops")
    in_mpi_ops = [n for n in HOROVOD_TORCH_NAMES if n not in (
        "elastic", "Compression", "allgather_object", "broadcast_object",
        "broadcast_optimizer_state", "broadcast_parameters", "DistributedOptimizer",
        "SyncBatchNorm")]
    missing = [name for name in in_mpi_ops if not hasattr(mpi_ops, name)]
    assert not missing, missing
    for module, name in (("compression", "Compression"), ("functions", "broadcast_parameters"),
                         ("optimizer", "DistributedOptimizer"), ("elastic", "TorchState"),
                         ("sync_batch_norm", "SyncBatchNorm")):
        assert hasattr(importlib.import_module("dtrain.torch." + module), name), module


_STEP_FAULTS = """
import resource, sys, torch, dtrain
def step():  # a step's tensors as LibTorch allocates them: twelve of 8 MB, written, then freed
    tensors = [torch.ones(2097152 + 1024 * i) for i in range(12)]
    del tensors
step(); step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    step()
print("faults", resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def test_import_keeps_what_a_step_frees_for_the_next():
    """import dtrain keeps freed memory in the heap (DTRAIN_KEEP_FREED_MB): 20 steps of 96 MB fault
    few pages in. glibc's defaults return a free heap top over twice its automatic threshold (at
    most 64 MB) to the kernel: with DTRAIN_KEEP_FREED_MB=0 these 20 steps took 40,960 faults
    (torch 1.13), with the default about 4,100."""
    env = job_env()
    for name in ("GLIBC_TUNABLES", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_",
                 "DTRAIN_KEEP_FREED_MB"):
        env.pop(name, None)
    p = run([PYTHON, "-c", _STEP_FAULTS], env=env)
    assert p.returncode == 0, p.stdout
    faults = int(re.search(r"faults (\d+)", p.stdout).group(1))
    assert faults < 20000, p.stdout
