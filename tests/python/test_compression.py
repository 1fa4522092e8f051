"""Gradient compression from Python and through dtrain-train: MXNet's expectations in real jobs,
the Trainer's compression_params, and training that still learns with every type, with the
optimizer on the servers or the workers and several local devices."""

import os
import re

import pytest

from conftest import TRAIN, job_env, launch_argv, program, run_ok

import dtrain
import dtrain.torch
import torch

BIG = {"MXNET_KVSTORE_BIGARRAY_BOUND": "1000"}


@pytest.mark.parametrize("kind,workers,servers", [("dist_sync", 2, 2), ("dist_sync", 3, 1)])
def test_mxnets_expectations_in_a_dist_job(spawn, kind, workers, servers):
    out = run_ok(spawn, launch_argv(workers, servers, program("gc_worker.py", kind)),
                 env=job_env(BIG))
    for r in range(workers):
        assert "gc_worker OK rank %d" % r in out, out


def test_mxnets_expectations_across_local_devices(spawn):
    assert "gc_worker OK" in run_ok(spawn, program("gc_worker.py", "device"))


def test_the_horovod_store_says_to_use_fp16_allreduce(spawn):
    script = ("import dtrain\nkv = dtrain.kv.create('horovod')\n"
              "try:\n    kv.set_gradient_compression({'type': '2bit'})\n"
              "except ValueError as e:\n    print('REFUSED', e)\n")
    out = run_ok(spawn, launch_argv(1, 0, [program("gc_worker.py", "x")[0], "-c", script]))
    assert "REFUSED" in out and "DTRAIN_FP16_ALLREDUCE" in out, out


def test_trainer_compression_params(spawn):
    kv = dtrain.kv.create("local")
    nets = [torch.nn.Linear(4, 1), torch.nn.Linear(4, 1)]
    trainer = dtrain.torch.Trainer(nets, "sgd", {"learning_rate": 0.1}, kvstore=kv,
                                   compression_params={"type": "2bit", "threshold": 0.5})
    for net in nets:
        net(torch.ones(2, 4)).sum().backward()
    trainer.step(4)
    trainer.close()
    with pytest.raises(ValueError, match="unknown gradient compression type"):
        dtrain.kv.create("local").set_gradient_compression({"type": "3bit"})


def accuracy(out):
    found = re.findall(r"\[worker 0\] Epoch 0: Test_acc ([0-9.]+)", out)
    assert found, out
    return float(found[-1])


@pytest.mark.parametrize("flags", [
    ["--gc-type", "2bit"],
    ["--gc-type", "1bit"],
    ["--gc-type", "fp16"],
    ["--gc-type", "2bit", "--update-on-kvstore", "false"],
    ["--gc-type", "2bit", "--devices", "2", "--fuse-below-kb", "0"],
    ["--gc-type", "2bit", "--kvstore", "dist_async"],
])
def test_dtrain_train_learns_with_compression(spawn, flags):
    argv = [TRAIN, "--dataset", "fashion-mnist", "--network", "lenet", "--epochs", "1",
            "--limit-train", "12000", "--log-interval", "0", *flags]
    if "--kvstore" not in flags:
        argv += ["--kvstore", "dist_sync"]
    out = run_ok(spawn, launch_argv(2, 2, argv), timeout=300)
    assert accuracy(out) > 0.7, out


def test_dtrain_train_saves_and_resumes_with_compression(spawn, tmp_path):
    # The residuals are the workers' own state and are not saved: a resumed job starts from zero
    # residuals, with the model and the servers' optimizer state restored.
    model = str(tmp_path / "model.pt")
    base = [TRAIN, "--dataset", "fashion-mnist", "--network", "lenet", "--epochs", "1",
            "--limit-train", "4000", "--log-interval", "0", "--kvstore", "dist_sync",
            "--gc-type", "2bit", "--gc-min-elements", "0"]
    first = accuracy(run_ok(spawn, launch_argv(2, 2, base + ["--save", model]), timeout=300))
    assert os.path.getsize(model) > 0
    # Two steps more from the saved model (256 samples, 64 a step on each worker) keep about its
    # accuracy; a resume that lost the model starts from scratch and lands near chance after two
    # steps. (It compared a whole second epoch with the first, two figures on the steep part of
    # the learning curve, each moved by the machine's kernels and threads.)
    resume = [a if a != "4000" else "256" for a in base]
    out = run_ok(spawn, launch_argv(2, 2, resume + ["--resume", model]), timeout=300)
    assert accuracy(out) > first - 0.1, (first, out)
