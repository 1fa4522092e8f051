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
