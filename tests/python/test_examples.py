"""The README's Python examples, started as the README starts them (shortened with --max-batches;
the full runs and their accuracy are in the closing notes and docs/performance.md)."""

import os
import re

import pytest

from conftest import PYTHON, REPO, launch_argv, mpirun_argv, run_ok

EXAMPLES = os.path.join(REPO, "examples", "python")
SHORT = ["--epochs", "1", "--max-batches", "150"]


def accuracies(out):
    return [float(a) for a in re.findall(r"Epoch 0: Test_acc ([0-9.]+)", out)]


def test_gluon_style_example_with_dist_sync(spawn):
    out = run_ok(spawn, launch_argv(2, 2, [PYTHON, os.path.join(EXAMPLES, "gluon_fashion_mnist.py"),
                                           *SHORT]))
    acc = accuracies(out)
    assert len(acc) == 2 and acc[0] == acc[1], out  # both workers hold the same model
    assert acc[0] > 0.6, out
    assert "Total number of workers: 2" in out and "This worker's rank: 1" in out


def test_gluon_style_example_with_two_devices_per_worker(spawn):
    out = run_ok(spawn, launch_argv(2, 1, [PYTHON, os.path.join(EXAMPLES, "gluon_fashion_mnist.py"),
                                           "--devices", "2", *SHORT]))
    assert len(accuracies(out)) == 2 and min(accuracies(out)) > 0.6, out


@pytest.mark.parametrize("launcher", ["mpirun", "gloo"])
def test_horovod_style_example(spawn, launcher):
    command = [PYTHON, os.path.join(EXAMPLES, "horovod_mnist.py"), *SHORT]
    argv = mpirun_argv(2, command) if launcher == "mpirun" else launch_argv(2, 0, command)
    out = run_ok(spawn, argv)
    acc = accuracies(out)
    assert len(acc) == 1 and acc[0] > 0.6, out  # printed by rank 0


@pytest.mark.parametrize("launcher", ["mpirun", "gloo"])
def test_horovod_sync_batch_norm_example_with_max_min_metrics(spawn, launcher):
    command = [PYTHON, os.path.join(EXAMPLES, "horovod_syncbn_mnist.py"), *SHORT]
    argv = mpirun_argv(2, command) if launcher == "mpirun" else launch_argv(2, 0, command)
    out = run_ok(spawn, argv)
    found = re.findall(r"Epoch 0: Test_acc ([0-9.]+) \(shares from ([0-9.]+) to ([0-9.]+)\)", out)
    assert len(found) == 1, out
    average, worst, best = map(float, found[0])
    assert worst <= average <= best and average > 0.6, out


@pytest.mark.parametrize("launcher,n", [("gloo", 2), ("mpirun", 4)])
def test_horovod_process_sets_example(spawn, launcher, n):
    command = [PYTHON, os.path.join(EXAMPLES, "horovod_process_sets.py"), *SHORT]
    argv = mpirun_argv(n, command) if launcher == "mpirun" else launch_argv(n, 0, command)
    out = run_ok(spawn, argv)
    found = dict(re.findall(r"Model (\w+): Test_acc ([0-9.]+)", out))
    assert set(found) == {"lenet", "mlp"}, out
    # 150 batches of one rank's learning rate: both well past chance (0.1).
    assert all(float(a) > 0.4 for a in found.values()), out


def test_dlrm_example_learns_the_clicks(spawn):
    """examples/python/dlrm.py with small tables (its default has a 1.07 GB one): its held-out
    AUC must come near the hidden model's own (the data's ceiling)."""
    out = run_ok(spawn, launch_argv(2, 2, [PYTHON, os.path.join(EXAMPLES, "dlrm.py"),
                                          "--tables", "20000,5000,500", "--steps", "150",
                                          "--test-samples", "5000"]))
    m = re.search(r"Test_auc ([0-9.]+) Test_acc ([0-9.]+).*own AUC ([0-9.]+)", out)
    assert m, out
    auc, ceiling = float(m.group(1)), float(m.group(3))
    assert auc > 0.75 and auc > ceiling - 0.08, out
