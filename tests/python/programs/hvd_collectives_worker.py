"""A rank that checks the rest of Horovod's collectives on dtrain: Min/Max/Product, alltoall,
reducescatter, the grouped forms, and the gradients of every collective against a reference
computed in this one process. Start it N times with `dtrain launch -n N -s 0` (Gloo) or
`mpirun -np N` (OpenMPI); prints "hvd_collectives OK rank R of N (BACKEND)". With --cuda the
reductions, alltoall and reducescatter run on CUDA tensors too (NCCL or host staging, as the job
chooses; alltoall and reducescatter always stage through the host).
"""

import contextlib
import sys

import torch

import dtrain
import dtrain.torch as hvd


def expect(name, got, want, tolerance=0.0):
    if got.device != want.device:
        raise AssertionError("%s: result on %s, want %s" % (name, got.device, want.device))
    got, want = got.cpu(), want.cpu()
    same = torch.equal(got, want) if tolerance == 0 else \
        got.shape == want.shape and torch.allclose(got, want, rtol=tolerance, atol=tolerance)
    if got.dtype != want.dtype or not same:
        raise AssertionError("%s: got %s %s %s, want %s %s %s" % (
            name, got.dtype, tuple(got.shape), got.flatten()[:8].tolist(), want.dtype,
            tuple(want.shape), want.flatten()[:8].tolist()))


def expect_error(name, call, kind):
    try:
        call()
    except kind:
        return
    raise AssertionError("%s: expected %s" % (name, kind.__name__))


def rank_input(k, shape, dtype=torch.float64):
    """What rank k holds in the gradient checks: every rank can compute every rank's."""
    generator = torch.Generator().manual_seed(1000 + k)
    return torch.randn(shape, generator=generator, dtype=dtype, device="cpu")


def reductions(n, r):
    # Rank k holds (k + i) % n + 1 at element i: every rank holds the extreme somewhere.
    def held(k, dtype):
        return torch.tensor([(k + i) % n + 1 for i in range(6)], dtype=dtype)
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32,
                  torch.int64):
        mine = held(r, dtype)
        # References in float64 (torch 1.13 has no CPU product of float16), exact here.
        everyone = torch.stack([held(k, torch.float64) for k in range(n)])
        expect("max %s" % dtype, hvd.allreduce(mine, op=hvd.Max),
               everyone.max(0).values.to(dtype))
        expect("min %s" % dtype, hvd.allreduce(mine, op=hvd.Min),
               everyone.min(0).values.to(dtype))
        expect("product %s" % dtype, hvd.allreduce(mine, op=hvd.Product),
               everyone.prod(0).to(dtype))
    t = torch.tensor([float(r), -float(r)])
    hvd.allreduce_(t, op=hvd.Max, name="max.inplace")
    expect("max in place", t, torch.tensor([float(n - 1), 0.0]))
    # Metrics as Horovod scripts reduce them: the best and worst loss of the job.
    grouped = hvd.grouped_allreduce([torch.tensor([r + 0.5]), torch.tensor([r + 0.25])],
                                    op=hvd.Min)
    expect("grouped min", grouped[1], torch.tensor([0.25]))


def alltoall(n, r):
    # Rank s sends (s + k) % 3 rows to rank k (none to some), each row (s, k, j).
    def rows(s):
        out = [[s, k, j] for k in range(n) for j in range((s + k) % 3)]
        return torch.tensor(out, dtype=torch.float32).reshape(-1, 3)
    splits = [(r + k) % 3 for k in range(n)]
    want = torch.tensor([[s, r, j] for s in range(n) for j in range((s + r) % 3)],
                        dtype=torch.float32).reshape(-1, 3)
    got, received = hvd.alltoall(rows(r), splits=torch.tensor(splits, dtype=torch.int32))
    expect("alltoall uneven", got, want)
    expect("alltoall received splits", received,
           torch.tensor([(s + r) % 3 for s in range(n)], dtype=torch.int32))
    # The even split (no splits): each rank gets one row from every rank; any dtype.
    for dtype in (torch.int64, torch.uint8, torch.bool, torch.float16):
        mine = torch.tensor([[r * 10 + k] for k in range(n)]).to(dtype)
        expect("alltoall even %s" % dtype, hvd.alltoall(mine),
               torch.tensor([[k * 10 + r] for k in range(n)]).to(dtype))
    h = hvd.alltoall_async(torch.full((n, 2), float(r)), splits=[1] * n, name="a2a.async")
    got, received = hvd.synchronize(h)
    expect("alltoall_async", got, torch.tensor([[float(k)] * 2 for k in range(n)]))
    if n > 1:
        expect_error("alltoall uneven without splits",
                     lambda: hvd.alltoall(torch.ones(n + 1, 2)), dtrain.InvalidArgument)
    expect_error("alltoall splits that do not add up",
                 lambda: hvd.alltoall(torch.ones(3), splits=[1] * (n + 1)), dtrain.InvalidArgument)


def reducescatter(n, r):
    for rows in (4 * n, 2 * n + 1):  # divides, and leaves rows over for the lower ranks
        tensor = torch.arange(rows * 3, dtype=torch.float64).reshape(rows, 3) * (r + 1)
        total = torch.arange(rows * 3, dtype=torch.float64).reshape(rows, 3) * (n * (n + 1) / 2)
        share, extra = divmod(rows, n)
        first = r * share + min(r, extra)
        count = share + (1 if r < extra else 0)
        expect("reducescatter sum %d rows" % rows, hvd.reducescatter(tensor, op=hvd.Sum),
               total[first:first + count])
        expect("reducescatter average %d rows" % rows, hvd.reducescatter(tensor),
               total[first:first + count] / n, 1e-12)
    ints = torch.tensor([[-75 if r == 0 else 0]] * n)
    expect("reducescatter integer average truncates", hvd.reducescatter(ints, op=hvd.Average),
           torch.tensor([[int(-75 / n)]]))
    expect("reducescatter max", hvd.reducescatter(torch.full((n, 2), float(r)), op=hvd.Max),
           torch.full((1, 2), float(n - 1)))
    outs = hvd.grouped_reducescatter([torch.ones(n, 2), torch.full((2 * n,), 2.0)], op=hvd.Sum)
    expect("grouped reducescatter 0", outs[0], torch.full((1, 2), float(n)))
    expect("grouped reducescatter 1", outs[1], torch.full((2,), 2.0 * n))
    expect_error("reducescatter of a scalar", lambda: hvd.reducescatter(torch.tensor(1.0)),
                 RuntimeError)
    expect_error("reducescatter by Adasum",
                 lambda: hvd.reducescatter(torch.ones(n), op=hvd.Adasum), dtrain.InvalidArgument)
    gathered = hvd.grouped_allgather([torch.full((r + 1,), float(r)), torch.tensor([[r, r]])])
    expect("grouped allgather 0", gathered[0],
           torch.cat([torch.full((k + 1,), float(k)) for k in range(n)]))
    expect("grouped allgather 1", gathered[1], torch.tensor([[k, k] for k in range(n)]))


def gradients(n, r, device):
    """Each collective's gradient on this rank against the same loss computed in this one
    process from every rank's inputs (each rank k's loss weighs what it sees by k + 1)."""
    def weight(k, shape):
        return torch.full(shape, float(k + 1), dtype=torch.float64)

    def local(x):
        return x.clone().to(device).requires_grad_()

    # allgather: Horovod's gradient is that of the average of the ranks' losses.
    xs = [rank_input(k, (k + 1, 3)) for k in range(n)]
    x = local(xs[r])
    gathered = hvd.allgather(x, name="grad.allgather")
    (gathered * weight(r, gathered.shape).to(device)).pow(2).sum().backward()
    every = torch.cat(xs).requires_grad_()
    (sum((every * weight(k, every.shape)).pow(2).sum() for k in range(n)) / n).backward()
    start = sum(k + 1 for k in range(r))
    expect("allgather gradient", x.grad.cpu(), every.grad[start:start + r + 1], 1e-12)

    # allreduce (Sum and Average): the gradient of the sum of the ranks' losses.
    for op, scale in ((hvd.Sum, 1.0), (hvd.Average, 1.0 / n)):
        xs = [rank_input(k, (4,)) for k in range(n)]
        x = local(xs[r])
        y = hvd.allreduce(x, op=op, name="grad.allreduce.%d" % op)
        (y * weight(r, y.shape).to(device)).pow(2).sum().backward()
        every = [v.clone().requires_grad_() for v in xs]
        reduced = sum(every) * scale
        sum((reduced * weight(k, reduced.shape)).pow(2).sum() for k in range(n)).backward()
        expect("allreduce gradient op %d" % op, x.grad.cpu(), every[r].grad, 1e-12)
    expect_error("max has no gradient",
                 lambda: hvd.allreduce(local(torch.ones(2)), op=hvd.Max).sum().backward(),
                 RuntimeError)

    # broadcast: the root gets the average of the ranks' gradients, the others zeros.
    root = n - 1
    x = local(rank_input(r, (5,)))
    y = hvd.broadcast(x, root, name="grad.broadcast")
    (y * weight(r, y.shape).to(device)).pow(2).sum().backward()
    source = rank_input(root, (5,)).requires_grad_()
    (sum((source * weight(k, (5,))).pow(2).sum() for k in range(n)) / n).backward()
    expect("broadcast gradient", x.grad.cpu(),
           source.grad if r == root else torch.zeros(5, dtype=torch.float64),
           1e-12)

    # alltoall: each row's gradient goes back to the rank that sent it.
    splits = [(r + k) % 2 + 1 for k in range(n)]
    x = local(rank_input(r, (sum(splits), 2)))
    y, _ = hvd.alltoall(x, splits=splits, name="grad.alltoall")
    (y * weight(r, y.shape).to(device)).pow(2).sum().backward()
    # Rank r's row j went to rank k, which weighs it by k + 1: d/dx of (w x)^2 is 2 w^2 x.
    owner = torch.cat([torch.full((s, 2), float(k + 1), dtype=torch.float64)
                       for k, s in enumerate(splits)])
    expect("alltoall gradient", x.grad.cpu(), 2 * owner.pow(2) * rank_input(r, x.shape), 1e-12)

    # reducescatter: every rank's gradient of its rows, gathered (times n for Sum, as Horovod).
    for op, scale in ((hvd.Sum, 1.0), (hvd.Average, 1.0 / n)):
        rows = 2 * n
        x = local(rank_input(r, (rows, 2)))
        y = hvd.reducescatter(x, op=op, name="grad.reducescatter.%d" % op)
        (y * weight(r, y.shape).to(device)).pow(2).sum().backward()
        every = [rank_input(k, (rows, 2)).requires_grad_() for k in range(n)]
        reduced = sum(every) * scale
        sum((reduced[2 * k:2 * k + 2] * weight(k, (2, 2))).pow(2).sum()
            for k in range(n)).backward()
        expect("reducescatter gradient op %d" % op, x.grad.cpu(), every[r].grad * n, 1e-12)


def made_on(device):
    """Where the tensors a block makes live (torch >= 2 can say so for a block; torch 1.13 runs
    only the CPU checks)."""
    return torch.device(device) if device != "cpu" else contextlib.nullcontext()


def main():
    device = "cuda" if "--cuda" in sys.argv[1:] else "cpu"
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    with made_on(device):
        reductions(n, r)
        alltoall(n, r)
        reducescatter(n, r)
    gradients(n, r, device)
    backend = "mpi" if hvd.mpi_enabled() else "gloo"
    hvd.shutdown()
    print("hvd_collectives OK rank %d of %d (%s)" % (r, n, backend), flush=True)


if __name__ == "__main__":
    sys.exit(main())
