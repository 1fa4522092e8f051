"""The type information users get: mypy on the dtrain package the suite imports (the build tree's
staged package, or a `pip install`'s, which mypy reads only through its py.typed marker), and on a
script that uses the public API as README.md and examples/python do, which must type-check except
for one deliberate misuse (so that a mypy that checks nothing fails here).

Needs mypy in the interpreter running the tests: skipped without it, unless DTRAIN_REQUIRE_MYPY=1
(scripts/test-pip.sh), which makes that a failure. mypy reads all of torch on a cold cache (a minute
or two): DTRAIN_MYPY_CACHE names a cache folder to keep between runs.
"""

import os
import re
import subprocess
import sys

import pytest

import dtrain
from conftest import PACKAGE_PATH, REPO

USER_MODULE = "dtrain_typing_user"

USER_SCRIPT = '''\
"""A user's script: dtrain's public API as README.md and examples/python use it."""

from typing import assert_type

import torch

import dtrain
import dtrain.torch
import dtrain.torch as hvd


def kvstore(grad: torch.Tensor) -> None:
    kv = dtrain.kv.create("dist_sync")
    w = torch.zeros(10)
    kv.init("w", torch.zeros(10))
    kv.init([3, 5], [torch.zeros(2), torch.zeros(2)])
    assert_type(kv.push("w", grad), dtrain.kv.Handle)
    kv.push(3, [grad[:2], grad[2:4]], priority=1)  # one tensor per local device
    kv.pull("w", out=w).wait()
    assert_type(kv.pull("w"), torch.Tensor)
    assert_type(kv.pull([3, 5]), list[torch.Tensor])
    kv.pushpull("w", grad, out=w).wait()
    dtrain.kv.waitall()
    kv.set_optimizer(dtrain.optimizer.create("sgd", learning_rate=0.1, momentum=0.9))
    kv.set_gradient_compression({"type": "2bit", "threshold": 0.5})
    assert_type(kv.rank, int)
    assert_type(kv.num_workers, int)
    try:
        kv.barrier()
    except dtrain.TimeoutError as e:
        print(e)
    kv.close()


def horovod(model: torch.nn.Module, data: torch.Tensor, target: torch.Tensor) -> None:
    hvd.init()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=hvd.Compression.fp16)
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(model(data), target).backward()
    optimizer.step()
    accuracy = hvd.allreduce(torch.tensor(0.9), name="test_accuracy")
    assert_type(accuracy, torch.Tensor)
    assert_type(hvd.rank(), int)
    hvd.synchronize(hvd.allreduce_async_(torch.zeros(3), name="in_place", op=hvd.Sum))
    if hvd.rank() == 0:
        print(accuracy.item(), hvd.allgather(torch.zeros(2, 3)).shape)


def gluon(nets: list[torch.nn.Module], x: torch.Tensor, y: torch.Tensor) -> None:
    store = dtrain.kv.create("dist_sync")
    sampler = dtrain.data.SplitSampler(len(x), store.num_workers, store.rank)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16,
                                         sampler=sampler, drop_last=True)
    trainer = dtrain.torch.Trainer(nets, "adam", {"learning_rate": 0.002}, kvstore=store)
    ctx = [torch.device("cpu")] * len(nets)
    loss_fn = torch.nn.CrossEntropyLoss(reduction="sum")
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for data, label in loader:
            parts = dtrain.data.split_and_load(data, ctx), dtrain.data.split_and_load(label, ctx)
            for replica, d, l in zip(nets, *parts):
                loss_fn(replica(d), l).backward()
            trainer.step(data.shape[0])
        trainer.wait()
    trainer.save_states("trainer.states")
    trainer.close()
    store.close()


def misuse() -> None:
    dtrain.data.SplitSampler("60000", 2, 0)  # MISUSE: a str for the int length
'''


def _require_mypy():
    try:
        import mypy  # noqa: F401
    except ImportError:
        if os.environ.get("DTRAIN_REQUIRE_MYPY") == "1":
            pytest.fail("DTRAIN_REQUIRE_MYPY=1 but mypy is not installed for %s" % sys.executable)
        pytest.skip("mypy is not installed for %s (`pip install mypy`; DTRAIN_REQUIRE_MYPY=1 "
                    "makes this a failure)" % sys.executable)


def test_package_and_a_users_script_type_check(tmp_path):
    _require_mypy()
    init = dtrain.__file__
    package = os.path.dirname(init)
    assert os.path.exists(os.path.join(package, "py.typed")), package
    (tmp_path / (USER_MODULE + ".py")).write_text(USER_SCRIPT)
    misuse_line = next(i for i, line in enumerate(USER_SCRIPT.splitlines(), 1)
                       if "# MISUSE" in line)

    # mypy finds both targets as Python would: the user's module in the working folder, dtrain on
    # the path the suite imports it from (PYTHONPATH for the build tree, site-packages for a pip
    # install), which mypy takes only with a py.typed. No MYPYPATH, which would skip that check.
    env = {k: v for k, v in os.environ.items() if k not in ("MYPYPATH", "PYTHONPATH")}
    if PACKAGE_PATH:
        env["PYTHONPATH"] = os.pathsep.join(PACKAGE_PATH)
    cache = os.environ.get("DTRAIN_MYPY_CACHE") or str(tmp_path / "mypy-cache")
    # The repository's settings (among them no_implicit_reexport for dtrain's modules, as `mypy
    # --strict` users have it: the names the API re-exports must stay visible to them). -v logs
    # the files mypy read.
    argv = [sys.executable, "-m", "mypy", "--config-file", os.path.join(REPO, "pyproject.toml"),
            "--cache-dir", cache, "--no-color-output", "-v",
            "-m", USER_MODULE, "-p", "dtrain"]
    p = subprocess.run(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=600)
    report = "%s\nexit %d\n%s" % (" ".join(argv), p.returncode, p.stdout)

    assert init in p.stderr or os.path.realpath(init) in p.stderr, (
        "mypy did not check the package under test, %s:\n%s" % (package, report))
    errors = [line for line in p.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 1 and p.returncode == 1, report
    assert re.match(r"(.*/)?%s\.py:%d: error: .*\"str\".*\"int\"" % (USER_MODULE, misuse_line),
                    errors[0]), report
