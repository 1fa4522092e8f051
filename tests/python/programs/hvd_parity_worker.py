"""A rank that checks where dtrain.torch must give what Horovod gives, bit for bit or in kind,
as Horovod's own test_torch.py asks it (issue 62): scaled reductions (prescale, postscale, an
average's postscale) in Horovod's arithmetic; sparse allreduce (Horovod's callable handle; sparse
gradients that stay sparse for SparseAdam, with and without sparse_as_dense); nccl_built() as a
version number; broadcast_optimizer_state with a frozen parameter before the first step; adding a
process set whose ranks form one already; a second collective of a name refused on every rank
however fast the first finished; ranks waiting for each other's collectives fail as a deadlock
instead of waiting out the collective timeout. Start it N times (N = 2 or 3: the expected sums below
assume the ranks' partial sums are rounded in any order of identical values, which holds up to 3
ranks) with `dtrain launch -n N -s 0` (Gloo) or `mpirun -np N` (OpenMPI). Prints
"hvd_parity OK rank R of N (BACKEND)".
"""

import os

import torch

import dtrain
import dtrain.torch as hvd

FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
DTYPES = FLOATS + (torch.int32, torch.int64)
FACTORS = (0.1915194503788923, 0.6221087710398319, 1.0 / 3.0, 2.5)


def expect(name, got, want):
    if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
        bad = (got.double() - want.double()).abs().max().item() if got.shape == want.shape else None
        raise AssertionError("%s: got %s %s, want %s %s (largest difference %s)" % (
            name, got.dtype, tuple(got.shape), want.dtype, tuple(want.shape), bad))


# --- Horovod's arithmetic, written out from its documentation and tests ----------------------
# Floats: a factor is rounded to the compute type and each product rounded once; the compute type
# is the tensor's own, float32 for float16 and bfloat16 on the host. Integers: float64, then a
# cast toward zero. Sums of float16/bfloat16 add in float32 and round each partial sum.

def compute_type(dtype):
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def scale(t, factor):
    if t.dtype in FLOATS:
        c = compute_type(t.dtype)
        return (t.to(c) * torch.tensor(factor, dtype=torch.float64).to(c)).to(t.dtype)
    return (t.to(torch.float64) * factor).trunc().to(t.dtype)


def sum_of_copies(t, n):
    acc = t
    for _ in range(n - 1):
        acc = (acc.to(compute_type(t.dtype)) + t.to(compute_type(t.dtype))).to(t.dtype)
    return acc


def horovod_reduce(t, n, op, pre, post):
    """What Horovod's allreduce gives when every one of n ranks holds `t`."""
    x = scale(t, pre) if pre != 1.0 else t
    s = sum_of_copies(x, n)
    factor = post / n if op == hvd.Average else post
    return scale(s, factor) if factor != 1.0 else s


def held(dtype, shape, seed):
    # Horovod's tests' inputs: integers in [-100, 100) as the dtype; the same on every rank.
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-100, 100, shape, generator=g).to(dtype)


def scaled_reductions(n, r):
    cases = 0
    for dtype in DTYPES:
        for dims in (1, 2, 3):
            shape = (n * 4,) * dims
            t = held(dtype, shape, 1234 + dims)
            for f in FACTORS:
                for op, pre, post in ((hvd.Sum, f, 1.0), (hvd.Sum, 1.0, f), (hvd.Sum, f, 1 / f),
                                      (hvd.Average, 1.0, f), (hvd.Average, f, 1.0)):
                    label = "%s %s %dd pre %r post %r" % (
                        "sum" if op == hvd.Sum else "average", dtype, dims, pre, post)
                    want = horovod_reduce(t, n, op, pre, post)
                    expect("allreduce " + label,
                           hvd.allreduce(t, op=op, prescale_factor=pre, postscale_factor=post),
                           want)
                    rows = want.shape[0] // n
                    expect("reducescatter " + label,
                           hvd.reducescatter(t, op=op, prescale_factor=pre,
                                             postscale_factor=post),
                           want[r * rows:(r + 1) * rows])
                    cases += 1
            grouped = hvd.grouped_reducescatter([t, t[:n]], op=hvd.Sum, prescale_factor=FACTORS[0])
            for i, (got, whole) in enumerate(zip(grouped, (t, t[:n]))):
                want = horovod_reduce(whole, n, hvd.Sum, FACTORS[0], 1.0)
                rows = whole.shape[0] // n
                expect("grouped_reducescatter %s %d" % (dtype, i), got,
                       want[r * rows:(r + 1) * rows])
    # Horovod's own expectation, literally (test_horovod_allreduce_prescale). It multiplies the
    # scaled float16 values by n in float32, which a sum of float16 values (Horovod's too) rounds
    # once n * x needs more than float16's 11 bits: at 2 ranks only, for float16.
    f = 0.1915194503788923
    literal = (torch.float32, torch.float64, torch.int32, torch.int64)
    for dtype in ((torch.float16,) if n == 2 else ()) + literal:
        t = held(dtype, (17, 17), 7)
        c = compute_type(dtype) if dtype in FLOATS else torch.float64
        multiplied = (torch.tensor(f, dtype=torch.float64).to(c) * t.to(c)).to(dtype)
        summed = hvd.allreduce(t, average=False, prescale_factor=f)
        if dtype == torch.float16:
            summed, multiplied = summed.float(), multiplied.float()
        multiplied *= n
        assert torch.allclose(summed, multiplied, 0), "Horovod's prescale check, %s" % dtype
    return cases


def sparse_allreduce(n, r):
    def rows_of(k):
        g = torch.Generator().manual_seed(50 + k)
        t = torch.rand(12, 3, generator=g)
        t[t < 0.7] = 0
        return t
    mine = rows_of(r).to_sparse()
    handle = hvd.sparse_allreduce_async(mine, name="sparse.a", op=hvd.Average)
    got = handle()  # Horovod's handle is callable
    assert got.is_sparse, "sparse_allreduce_async gave a dense result"
    want = sum(rows_of(k) for k in range(n)) / n
    assert torch.allclose(got.to_dense(), want, rtol=0, atol=1e-6), "sparse average"
    h = hvd.sparse_allreduce_async(mine, name="sparse.b", op=hvd.Sum)
    assert torch.allclose(hvd.synchronize(h).to_dense(), want * n, rtol=0, atol=1e-6)
    if n > 2:
        pair = hvd.add_process_set([0, 1])
        if pair.included():
            got = hvd.sparse_allreduce_async(mine, name="sparse.c", op=hvd.Average,
                                             process_set=pair)()
            assert torch.allclose(got.to_dense(), (rows_of(0) + rows_of(1)) / 2, rtol=0,
                                  atol=1e-6), "sparse average in a process set"
        hvd.remove_process_set(pair)


def sparse_embeddings(n, r):
    """DistributedOptimizer over nn.Embedding(sparse=True) with SparseAdam: the gradient stays
    sparse; every rank ends with the parameters of one SparseAdam step on the average gradient."""
    def batch(k):
        return torch.tensor([[1, 2, 4, 5], [4, 3, 2, 9]]) if k % 2 == 0 else \
            torch.tensor([[1, 3, 4], [4, 7, 9]])
    for sparse_as_dense in (False, True):
        torch.manual_seed(3)
        model = torch.nn.Embedding(10, 3, sparse=True)
        reference = torch.nn.Embedding(10, 3, sparse=True)
        reference.load_state_dict(model.state_dict())
        opt = hvd.DistributedOptimizer(torch.optim.SparseAdam(list(model.parameters()), lr=0.1),
                                       named_parameters=model.named_parameters(),
                                       sparse_as_dense=sparse_as_dense)
        opt.zero_grad()
        model(batch(r)).sum().backward()
        opt.step()
        assert model.weight.grad.is_sparse, "sparse_as_dense=%s: the gradient became dense" % (
            sparse_as_dense,)
        ref_opt = torch.optim.SparseAdam(list(reference.parameters()), lr=0.1)
        grads = []
        for k in range(n):
            reference.zero_grad()
            reference(batch(k)).sum().backward()
            grads.append(reference.weight.grad.to_dense())
        reference.weight.grad = (sum(grads) / n).to_sparse()
        ref_opt.step()
        assert torch.allclose(model.weight, reference.weight, rtol=0, atol=1e-6), \
            "sparse_as_dense=%s: parameters differ from one SparseAdam step" % (sparse_as_dense,)


def nccl_version():
    v = hvd.nccl_built()
    assert type(v) is int, "nccl_built() gave %r, Horovod gives an int" % (v,)
    if dtrain._dtrain.nccl_built():
        assert v >= 2700, "nccl_built() = %d: not a NCCL_VERSION_CODE" % v
    else:
        assert v == 0, "nccl_built() = %d without NCCL" % v


def optimizer_state_with_frozen_parameter(n, r):
    class Frozen(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Parameter(torch.tensor([1, 3], dtype=torch.int32),
                                        requires_grad=False)
            self.b = torch.nn.Parameter(torch.rand(4) + r)  # differs until broadcast

    model = Frozen()
    opt = torch.optim.SGD(model.parameters(), lr=0.001, weight_decay=1e-6, momentum=0.9,
                          nesterov=True)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert model.a.grad is None, "a frozen parameter got a gradient"
    grad = model.b.grad
    assert grad is not None and torch.equal(grad, torch.zeros(4)), "no zero gradient made"
    expect("b's gradient is root's", hvd.broadcast(grad, root_rank=0), grad)
    momentum = opt.state_dict()["state"][1]["momentum_buffer"]
    expect("momentum is root's", hvd.broadcast(momentum, root_rank=0), momentum)
    expect("b is root's", hvd.broadcast(model.b.detach(), root_rank=0), model.b.detach())


def duplicate_process_set(n):
    """Horovod's rule: a set whose ranks form one already is refused (ValueError) on every rank,
    and the job goes on; once removed, the same ranks may form a set again."""
    first = hvd.add_process_set([0])
    try:
        hvd.add_process_set([0])
    except ValueError as e:
        assert "already" in str(e), str(e)
    else:
        raise AssertionError("a duplicate process set was accepted")
    expect("after the refusal", hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), n * 1.0))
    assert hvd.remove_process_set(first)
    again = hvd.add_process_set([0])
    assert hvd.remove_process_set(again)


def duplicate_names(r):
    """Horovod's test_horovod_*_duplicate_name_error: rank 0 submits twice while the others wait
    in a barrier, then the others do (their first finishes at once: rank 0's is waiting)."""
    t = torch.ones(17)
    for turn in (0, 1):
        if (r == 0) == (turn == 0):
            hvd.allreduce_async(t, name="twice")
            try:
                hvd.allreduce_async(t, name="twice")
            except ValueError as e:
                assert "in flight" in str(e), str(e)
            else:
                raise AssertionError("a second allreduce 'twice' in flight was accepted")
        hvd.barrier()


def deadlock(r):
    """Rank 0 waits in a barrier, the others for an allreduce rank 0 never submits: every rank
    fails within DTRAIN_DEADLOCK_MS (set below), naming what waited, and named collectives go on
    (unnamed ones and barriers are numbered by each rank, and rank 0 counted one barrier more)."""
    try:
        if r == 0:
            hvd.barrier()
        else:
            hvd.allreduce(torch.ones(3), name="never.on.rank0")
    except ValueError as e:
        text = str(e)
        assert "deadlock" in text and "'never.on.rank0' submitted by" in text, text
    else:
        raise AssertionError("no deadlock error")
    expect("after the deadlock", hvd.allreduce(torch.ones(2), op=hvd.Sum, name="after"),
           torch.full((2,), hvd.size() * 1.0))


def main():
    os.environ.setdefault("DTRAIN_DEADLOCK_MS", "1000")
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    assert n in (2, 3), "run with 2 or 3 ranks"
    cases = scaled_reductions(n, r)
    sparse_allreduce(n, r)
    sparse_embeddings(n, r)
    nccl_version()
    optimizer_state_with_frozen_parameter(n, r)
    duplicate_process_set(n)
    duplicate_names(r)
    deadlock(r)  # last: barriers (numbered per rank) no longer pair up after it
    print("hvd_parity OK rank %d of %d (%s): %d scaled cases" % (
        r, n, "mpi" if hvd.mpi_enabled() else "gloo", cases), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
