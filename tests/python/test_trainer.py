"""dtrain.torch.Trainer: N workers end with the parameters of one process given the whole batch
(programs/train_check.py), with the optimizer on the servers or the workers, fused or not, over
several local devices, with an embedding's sparse gradients, with bfloat16 parameters (float32
master weights), and over the horovod store."""

import pytest

from conftest import launch_argv, program, run_ok
from test_horovod import relative_difference


def bound(workers, flags):
    """train_check.py's: bfloat16 gradients of parts of the batch round apart from the whole's."""
    return 2e-2 if "--bfloat16" in flags and workers > 1 else 1e-5


@pytest.mark.parametrize("workers,servers,flags", [
    (2, 2, []),
    (2, 1, ["--update-on-worker"]),
    (2, 2, ["--no-fuse"]),
    (3, 2, ["--update-on-worker", "--no-fuse"]),
    (2, 1, ["--devices", "2"]),
    (2, 1, ["--params"]),
    (1, 1, []),
    (2, 2, ["--embedding"]),
    (2, 1, ["--embedding", "--update-on-worker"]),
    (1, 1, ["--bfloat16"]),
    (2, 2, ["--bfloat16"]),
    (2, 1, ["--bfloat16", "--update-on-worker", "--no-fuse"]),
])
def test_trainer_matches_one_process(spawn, workers, servers, flags):
    out = run_ok(spawn, launch_argv(workers, servers, program("train_check.py", "trainer", *flags)))
    assert relative_difference(out) < bound(workers, flags)


@pytest.mark.parametrize("flags", [[], ["--update-on-worker"], ["--embedding"], ["--bfloat16"]])
def test_trainer_over_the_horovod_store(spawn, flags):
    out = run_ok(spawn, launch_argv(2, 0, program("train_check.py", "trainer", "--kvstore",
                                                  "horovod", *flags)))
    assert relative_difference(out) < bound(2, flags)


def test_trainer_over_a_local_store(spawn):
    """CPU parameters: the local store runs the optimizer by default (CUDA ones update on their
    GPU instead: test_gpu.py)."""
    out = run_ok(spawn, program("train_check.py", "trainer", "--kvstore", "local", "--devices", "2",
                                "--default-update"))
    assert "train_check update_on_kvstore True" in out, out
    assert relative_difference(out) < 1e-5
