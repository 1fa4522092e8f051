"""A rank that checks Horovod's process sets, SyncBatchNorm, sparse gradients, the
DistributedOptimizer's gradient groups, the runtime timeline and the refusal of duplicate names on
dtrain, every result against values computed here. Start it N times (N >= 2) with
`dtrain launch -n N -s 0` (Gloo) or `mpirun -np N` (OpenMPI); prints "hvd_process_sets OK rank
R of N (BACKEND)". Arguments: a scratch directory for the timeline, and --cuda to run the process
sets' collectives and SyncBatchNorm on CUDA tensors.
"""

import json
import os
import sys
import threading
import time
import warnings

import torch

import dtrain
import dtrain.torch as hvd

from hvd_collectives_worker import expect, expect_error, made_on


def static_and_dynamic_sets(n, r):
    evens = [k for k in range(n) if k % 2 == 0]
    odds = [k for k in range(n) if k % 2 == 1]
    even_set = hvd.ProcessSet(evens)
    hvd.init(process_sets=[even_set])  # the second init only registers the set
    assert even_set.process_set_id == 1, even_set
    odd_set = hvd.add_process_set(odds)
    assert odd_set.process_set_id == 2, odd_set
    mine, members = (even_set, evens) if r % 2 == 0 else (odd_set, odds)
    other = odd_set if mine is even_set else even_set
    assert mine.included() and not other.included()
    assert mine.size() == len(members) and mine.rank() == members.index(r)
    assert hvd.global_process_set.ranks == list(range(n))

    # The same names in both sets at once: each set's own collectives.
    t = torch.full((5,), float(r))
    expect("allreduce in set", hvd.allreduce(t, name="x", op=hvd.Sum, process_set=mine),
           torch.full((5,), float(sum(members))))
    expect("average in set", hvd.allreduce(t, name="y", process_set=mine),
           torch.full((5,), sum(members) / len(members)))
    ints = torch.tensor([r - 3], dtype=torch.int64)
    expect("integer average in set", hvd.allreduce(ints, name="i", process_set=mine),
           torch.tensor([int(sum(k - 3 for k in members) / len(members))], dtype=torch.int64))
    gathered = hvd.allgather(torch.full((r + 1, 2), float(r)), process_set=mine)
    expect("allgather in set", gathered,
           torch.cat([torch.full((k + 1, 2), float(k)) for k in members]))
    ints = hvd.allgather(torch.tensor([r], dtype=torch.int32), process_set=mine)
    expect("allgather ints in set", ints, torch.tensor(members, dtype=torch.int32))
    for root in members:
        got = hvd.broadcast(torch.full((3,), float(r)), root_rank=root, process_set=mine)
        expect("broadcast from %d in set" % root, got, torch.full((3,), float(root)))
    out, counts = hvd.alltoall(torch.arange(len(members), dtype=torch.float32) + 10 * r,
                               splits=[1] * len(members), process_set=mine)
    expect("alltoall in set", out,
           torch.tensor([10.0 * k + mine.rank() for k in members]))
    rows = 2 * len(members) + 1
    scattered = hvd.reducescatter(torch.ones(rows, 2), op=hvd.Sum, process_set=mine)
    share = rows // len(members) + (1 if mine.rank() < rows % len(members) else 0)
    expect("reducescatter in set", scattered, torch.full((share, 2), float(len(members))))
    grouped = hvd.grouped_allreduce([torch.ones(2), torch.ones(3) * r], op=hvd.Sum,
                                    process_set=mine)
    expect("grouped allreduce in set", grouped[1], torch.full((3,), float(sum(members))))
    assert hvd.broadcast_object({"r": r}, root_rank=members[-1], process_set=mine) == \
        {"r": members[-1]}
    assert hvd.allgather_object(r, process_set=mine) == members
    hvd.barrier(process_set=mine)

    # Gradients flow within the set.
    x = torch.full((4,), float(r + 1), requires_grad=True)
    hvd.allgather(x, process_set=mine).sum().backward()
    expect("allgather gradient in set", x.grad, torch.ones(4))

    # Misuse: a set this rank is not in, a root outside the set, an unregistered set.
    expect_error("collective on a set without this rank",
                 lambda: hvd.allreduce(torch.ones(1), process_set=other), ValueError)
    if len(members) < n:
        outsider = next(k for k in range(n) if k not in members)
        expect_error("root outside the set",
                     lambda: hvd.broadcast(torch.ones(1), outsider, process_set=mine),
                     dtrain.InvalidArgument)
    expect_error("unregistered set",
                 lambda: hvd.allreduce(torch.ones(1), process_set=hvd.ProcessSet([0])),
                 dtrain.InvalidArgument)
    # Adding the same ranks twice, or ranks that are not the job's, fails on every rank alike.
    expect_error("duplicate set", lambda: hvd.add_process_set(evens), dtrain.InvalidArgument)
    expect_error("rank outside the job", lambda: hvd.add_process_set([0, n]),
                 dtrain.InvalidArgument)
    # Ranks that ask for different sets all get the error (nobody waits for a set never made).
    expect_error("ranks disagree", lambda: hvd.add_process_set([r]), dtrain.InvalidArgument)
    # The global set after all that still works.
    expect("global allreduce", hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), float(n)))
    return even_set, odd_set, mine, members


def sets_run_concurrently(n, r, mine, members):
    """Two sets that each hold a collective open: a set's collective completes while every rank
    of the job also has one pending on the global set."""
    pending = hvd.allreduce_async(torch.ones(1), name="global.late", op=hvd.Sum)
    got = hvd.allreduce(torch.ones(1), name="set.first", op=hvd.Sum, process_set=mine)
    expect("set while global pending", got, torch.full((1,), float(len(members))))
    expect("global after set", hvd.synchronize(pending), torch.full((1,), float(n)))
    # Threads submitting to both sets at once.
    errors = []

    def in_set():
        try:
            for i in range(20):
                hvd.allreduce(torch.ones(3), name="t.%d" % i, process_set=mine)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
    thread = threading.Thread(target=in_set)
    thread.start()
    for i in range(20):
        hvd.allreduce(torch.ones(3), name="g.%d" % i)
    thread.join(60)
    assert not thread.is_alive() and not errors, errors


def remove_and_readd(n, r, even_set, odd_set):
    assert hvd.remove_process_set(odd_set)
    assert odd_set.process_set_id is None and odd_set.size() is None
    assert not hvd.remove_process_set(odd_set)  # gone already
    assert not hvd.remove_process_set(hvd.global_process_set)
    expect_error("removed set", lambda: hvd.allreduce(torch.ones(1), process_set=odd_set),
                 dtrain.InvalidArgument)
    again = hvd.add_process_set([k for k in range(n) if k % 2 == 1])
    assert again.process_set_id == 2, again  # the smallest free id
    if again.included():
        expect("re-added set", hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=again),
               torch.full((1,), float(len(again.ranks))))
    assert hvd.remove_process_set(again)
    assert hvd.remove_process_set(even_set)


def sync_batch_norm(n, r, device):
    """SyncBatchNorm over ranks with different batch sizes equals BatchNorm over every rank's
    samples together, forward, running statistics and gradients."""
    def batch(k):
        g = torch.Generator().manual_seed(50 + k)
        x = torch.randn(k + 2, 3, 4, 4, generator=g, dtype=torch.float64, device="cpu")
        return (x * (k + 1) + k).to(device)
    torch.manual_seed(0)
    sync = hvd.SyncBatchNorm(3).double().to(device)
    plain = torch.nn.BatchNorm2d(3).double().to(device)
    with torch.no_grad():
        for m in (sync, plain):
            m.weight.copy_(torch.tensor([1.0, 2.0, 0.5], device=device))
            m.bias.copy_(torch.tensor([0.1, -0.2, 0.3], device=device))
    x = batch(r).requires_grad_()
    everyone = torch.cat([batch(k) for k in range(n)]).requires_grad_()
    weights = torch.randn(everyone.shape, generator=torch.Generator().manual_seed(7),
                          dtype=torch.float64, device="cpu").to(device)
    first = sum(batch(k).shape[0] for k in range(r))
    mine_w = weights[first:first + x.shape[0]]
    for step in range(2):
        y = sync(x)
        want = plain(everyone)
        expect("sync batch norm forward %d" % step, y, want[first:first + x.shape[0]].detach(),
               tolerance=1e-9)
        # Each rank's loss is its own samples' part; their sum is the one-process loss.
        (y * mine_w).sum().backward()
        (want * weights).sum().backward()
    expect("running mean", sync.running_mean, plain.running_mean, tolerance=1e-9)
    expect("running var", sync.running_var, plain.running_var, tolerance=1e-9)
    expect("input gradient", x.grad, everyone.grad[first:first + x.shape[0]], tolerance=1e-9)
    # The weights' gradients: each rank's part, which DistributedOptimizer would sum (Sum) or
    # average; summed here they are the one-process gradient.
    total = hvd.allreduce(sync.weight.grad, op=hvd.Sum, name="bn.weight.grad")
    expect("weight gradient", total, plain.weight.grad, tolerance=1e-9)
    sync.eval()
    expect("eval uses running stats", sync(x).detach(), plain.eval()(x).detach(), tolerance=1e-9)
    expect_error("1-d input", lambda: sync(torch.ones(3, device=device)), ValueError)


def sparse_gradients(n, r):
    """An Embedding with sparse gradients under DistributedOptimizer and SparseAdam: the
    gradient stays sparse and is every rank's, averaged."""
    torch.manual_seed(0)
    emb = torch.nn.Embedding(10, 3, sparse=True)
    opt = hvd.DistributedOptimizer(torch.optim.SparseAdam(emb.parameters(), lr=0.1),
                                   named_parameters=emb.named_parameters())
    hvd.broadcast_parameters(emb.state_dict(), root_rank=0)
    rows = torch.tensor([r, r + 1])
    emb(rows).sum().backward()
    opt.synchronize()
    grad = emb.weight.grad
    assert grad.is_sparse, grad
    want = torch.zeros(10, 3)
    for k in range(n):
        want[k] += 1.0 / n
        want[k + 1] += 1.0 / n
    expect("sparse gradient", grad.to_dense(), want, tolerance=1e-6)
    with opt.skip_synchronize():
        opt.step()
    # sparse_as_dense: the same average, sent dense; the gradient is sparse again (Horovod's: a
    # sparse optimizer such as SparseAdam takes no other).
    emb2 = torch.nn.Embedding(10, 3, sparse=True)
    opt2 = hvd.DistributedOptimizer(torch.optim.SGD(emb2.parameters(), lr=0.1),
                                    named_parameters=[("dense." + k, v) for k, v in
                                                      emb2.named_parameters()],
                                    sparse_as_dense=True)
    emb2(rows).sum().backward()
    opt2.synchronize()
    assert emb2.weight.grad.is_sparse
    expect("sparse as dense", emb2.weight.grad.to_dense(), want, tolerance=1e-6)
    assert set(opt._parameter_names.values()) == {"weight"}, opt._parameter_names


def small_model():
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3))


def train_steps(model, groups, steps=3, **kwargs):
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), groups=groups,
                                   **kwargs)
    for step in range(steps):
        torch.manual_seed(100 * hvd.rank() + step)  # each rank its own batch
        opt.zero_grad()
        model(torch.randn(8, 5)).square().sum().backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def gradient_groups(n, r):
    """Horovod's `groups`: however the gradients are grouped, the same reductions, the same bits."""
    plain = train_steps(small_model(), None)
    one = train_steps(small_model(), 1)
    model = small_model()
    w1, b1, w2, _ = model.parameters()  # the last bias in no group: reduced alone
    listed = train_steps(model, [[w1, b1], [w2]])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old_name = train_steps(small_model(), None, num_groups=3)
    assert any(issubclass(w.category, DeprecationWarning) for w in caught), caught
    for name, got in [("groups=1", one), ("list groups", listed), ("num_groups=3", old_name)]:
        for a, b in zip(got, plain):
            assert torch.equal(a, b), "%s: %s != %s" % (name, a, b)
    for overlap in ["1", "0"]:  # either way, the same bits
        os.environ["DTRAIN_OVERLAP_GRADIENTS"] = overlap
        got = train_steps(small_model(), None)
        assert all(torch.equal(a, b) for a, b in zip(got, plain)), overlap
    os.environ["DTRAIN_OVERLAP_GRADIENTS"] = "sometimes"
    expect_error("DTRAIN_OVERLAP_GRADIENTS=sometimes", lambda: train_steps(small_model(), None),
                 ValueError)
    del os.environ["DTRAIN_OVERLAP_GRADIENTS"]
    for bad in [0, -1, "2", [[torch.zeros(1)]], [[w1], [w1]], [[w1, 3]]]:
        expect_error("groups=%r" % (bad,), lambda bad=bad: hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1), groups=bad), ValueError)


def runtime_timeline(n, r, scratch):
    path = os.path.join(scratch, "timeline.json")
    hvd.start_timeline(path)
    expect_error("started twice", lambda: hvd.start_timeline(path), dtrain.InvalidArgument)
    hvd.allreduce(torch.ones(4), name="timeline.probe")
    # A grouped allreduce is held back until the whole group is submitted: one fused batch.
    hvd.grouped_allreduce([torch.ones(1000 * (i + 1)) for i in range(5)], name="timeline.group")
    # So are the gradients of one of the DistributedOptimizer's groups (all 4 here: 39 floats),
    # and all of them without groups where DTRAIN_OVERLAP_GRADIENTS=0.
    train_steps(small_model(), 1, steps=1)
    os.environ["DTRAIN_OVERLAP_GRADIENTS"] = "0"
    train_steps(small_model(), None, steps=1)
    del os.environ["DTRAIN_OVERLAP_GRADIENTS"]
    # The engine's span of an allreduce ends just after its waiter wakes; by the end of the next
    # collective (the same engine thread) it has surely been recorded.
    hvd.barrier()
    hvd.stop_timeline()
    hvd.stop_timeline()  # nothing started: nothing to do
    mine = path if r == 0 else "%s.rank-%d.json" % (path, r)
    with open(mine) as f:
        events = json.load(f)["traceEvents"]
    assert any(e["name"] == "allreduce" for e in events), events[:5]
    batches = [e.get("args", {}) for e in events if e["name"] == "allreduce"]
    assert {"tensors": 5, "bytes": 60000} in batches, batches
    assert batches.count({"tensors": 4, "bytes": 156}) == 2, batches
    hvd.allreduce(torch.ones(4), name="timeline.after")  # not recorded, and no file rewritten


def duplicate_names(n, r):
    """A name submitted again while in flight: rank 0 submits its second at once (refused there);
    the others only after their first has finished (accepted there). Every rank's second fails,
    every time, and the ranks stay in step."""
    for trial in range(5):
        name = "dup.%d" % trial
        if r != 0:
            time.sleep(0.1)  # rank 0's first is surely still in flight when it submits again
        first = hvd.allreduce_async(torch.ones(2), name=name)
        if r == 0:
            expect_error("second '%s' on rank 0" % name,
                         lambda: hvd.allreduce_async(torch.ones(2), name=name),
                         dtrain.InvalidArgument)
            hvd.synchronize(first)
        else:
            hvd.synchronize(first)
            second = hvd.allreduce_async(torch.ones(2), name=name)
            expect_error("second '%s' on rank %d" % (name, r), lambda: hvd.synchronize(second),
                         dtrain.InvalidArgument)
    expect("in step after duplicates", hvd.allreduce(torch.ones(1), op=hvd.Sum, name="dup.after"),
           torch.full((1,), float(n)))


def main():
    scratch = sys.argv[1]
    device = "cuda" if "--cuda" in sys.argv[2:] else "cpu"
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    with made_on(device):
        even_set, odd_set, mine, members = static_and_dynamic_sets(n, r)
        sets_run_concurrently(n, r, mine, members)
        remove_and_readd(n, r, even_set, odd_set)
    duplicate_names(n, r)
    sync_batch_norm(n, r, device)
    sparse_gradients(n, r)
    gradient_groups(n, r)
    runtime_timeline(n, r, scratch)
    print("hvd_process_sets OK rank %d of %d (%s)"
          % (r, n, "mpi" if hvd.mpi_enabled() else "gloo"), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
