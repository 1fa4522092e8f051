"""dtrain.torch.Trainer: N workers end with the parameters of one process given the whole batch
(programs/train_check.py), with the optimizer on the servers or the workers, fused or not, over
several local devices, with an embedding's sparse gradients, with bfloat16 parameters (float32
master weights), with gradients accumulated over backward passes, with the learning rate changed
between two steps (on the servers too), and over the horovod store; and a backward too many is an
error, never ignored."""

import pytest

from conftest import launch_argv, program, run_ok
from test_horovod import relative_difference


def bound(workers, flags):
    """train_check.py's: bfloat16 gradients of parts of the batch round apart from the whole's."""
    if "--bfloat16" in flags:
        return 2e-2 if workers > 1 else 5e-3
    return 1e-5


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
    (2, 2, ["--backward-passes", "3"]),  # gradient accumulation
    (2, 1, ["--backward-passes", "2", "--update-on-worker", "--devices", "2"]),
    (2, 2, ["--lr-change"]),  # set_learning_rate with the optimizer on the servers
    (2, 1, ["--lr-change", "--update-on-worker"]),
])
def test_trainer_matches_one_process(spawn, workers, servers, flags):
    out = run_ok(spawn, launch_argv(workers, servers, program("train_check.py", "trainer", *flags)))
    assert relative_difference(out) < bound(workers, flags)


@pytest.mark.parametrize("flags", [[], ["--update-on-worker"], ["--embedding"], ["--bfloat16"],
                                   ["--lr-change"]])
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


def test_a_backward_beyond_the_steps_passes_is_an_error():
    """Before, the second backward's gradient was dropped in silence. Sums of two passes when
    asked for (backward_passes_per_step=2), an error naming the remedy when not."""
    import torch
    import dtrain
    import dtrain.torch

    def two_backwards(passes):
        net = torch.nn.Linear(2, 1, bias=False)
        with torch.no_grad():
            net.weight.zero_()
        trainer = dtrain.torch.Trainer(net, "sgd", {"learning_rate": 1.0}, kvstore="local",
                                       backward_passes_per_step=passes)
        net(torch.ones(1, 2)).sum().backward()
        net(torch.full((1, 2), 3.0)).sum().backward()
        trainer.step(1)
        trainer.wait()
        return net.weight.detach()

    assert two_backwards(2).tolist() == [[-4.0, -4.0]]
    with pytest.raises(dtrain.InvalidArgument, match="gradient 2 since the last step.*"
                       "backward_passes_per_step"):
        two_backwards(1)
    with pytest.raises(dtrain.InvalidArgument, match="at least 1"):
        two_backwards(0)


def test_a_parameter_the_forward_did_not_use_is_refused_unless_ignore_stale_grad():
    """Gluon's ignore_stale_grad: it was accepted and ignored (a stale gradient silently counted as
    zeros). Now a step with a parameter backward did not reach is an error naming it, and with
    ignore_stale_grad=True the gradient counts as zeros: the used parameter moves, the unused one
    (plain SGD) keeps its value."""
    import torch
    import dtrain
    import dtrain.torch

    class TwoHeads(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.used = torch.nn.Linear(2, 1, bias=False)
            self.unused = torch.nn.Linear(2, 1, bias=False)

        def forward(self, x):
            return self.used(x)

    net = TwoHeads()
    with torch.no_grad():
        net.used.weight.zero_()
        net.unused.weight.fill_(5.0)
    trainer = dtrain.torch.Trainer(net, "sgd", {"learning_rate": 1.0}, kvstore="local")
    net(torch.ones(1, 2)).sum().backward()
    with pytest.raises(dtrain.InvalidArgument,
                       match="parameter 'unused.weight' on cpu has not been produced by backward"
                       ".*ignore_stale_grad=True"):
        trainer.step(1)
    trainer.step(1, ignore_stale_grad=True)
    trainer.wait()
    assert net.used.weight.detach().tolist() == [[-1.0, -1.0]]
    assert net.unused.weight.detach().tolist() == [[5.0, 5.0]]
    # The next step checks afresh: a backward that reaches both is accepted.
    (net(torch.ones(1, 2)) + net.unused(torch.ones(1, 2))).sum().backward()
    trainer.step(1)
    trainer.wait()
    assert net.unused.weight.detach().tolist() == [[4.0, 4.0]]
    trainer.close()


def test_a_trainer_made_again_on_the_same_module_leaves_no_hooks_behind():
    """A new Trainer without close() on the old one (say, for another optimizer): the old one's
    hooks go with it, so its counts cannot call a later backward one too many."""
    import gc
    import torch
    import dtrain
    import dtrain.torch

    net = torch.nn.Linear(2, 1)
    old = dtrain.torch.Trainer(net, "sgd", {"learning_rate": 0.1}, kvstore="local")
    net(torch.ones(1, 2)).sum().backward()
    old.step(1)
    del old
    gc.collect()
    trainer = dtrain.torch.Trainer(net, "sgd", {"learning_rate": 0.1}, kvstore="local")
    for _ in range(3):
        net(torch.ones(1, 2)).sum().backward()
        trainer.step(1)
    trainer.wait()
    assert len(net._forward_pre_hooks) == 1  # the new trainer's gate only
