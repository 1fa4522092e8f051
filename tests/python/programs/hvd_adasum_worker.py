"""A rank that checks Horovod's op=Adasum on dtrain: allreduce and grouped_allreduce against a
reference tree computed here from every rank's inputs (float64 and float32 within Horovod's
tolerance, float16 and bfloat16 close), prescale/postscale, a process set, the gradient, what is
refused, and DistributedOptimizer(op=Adasum) against the same training simulated in this one
process. Start it N times with `dtrain launch -n N -s 0` (Gloo) or `mpirun -np N` (OpenMPI);
prints "hvd_adasum OK rank R of N (BACKEND)". With N not a power of two it checks that Adasum is
refused (Horovod's NotImplementedError) and that the job goes on. With --cuda the allreduces and
the gradient run on CUDA tensors (staged through host memory, as Adasum always is).
"""

import copy
import sys

DEVICE = "cuda" if "--cuda" in sys.argv[1:] else "cpu"

import torch

import dtrain
import dtrain.torch as hvd


def rank_input(k, shape, dtype=torch.float64, salt=0):
    """What rank k holds: every rank can compute every rank's."""
    generator = torch.Generator().manual_seed(7000 + 31 * salt + k)
    return torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype)


def mine(r, shape, dtype=torch.float64, salt=0):
    """This rank's input, on the device the run checks."""
    return rank_input(r, shape, dtype, salt).to(DEVICE)


def pair(a, b):
    """Adasum of two tensors, in float64 (the paper's formula, as Horovod computes it)."""
    a, b = a.double(), b.double()
    dot, aa, bb = (a * b).sum(), (a * a).sum(), (b * b).sum()
    ca = 1 - dot / (2 * aa) if aa > 0 else 1.0
    cb = 1 - dot / (2 * bb) if bb > 0 else 1.0
    return ca * a + cb * b


def tree(values):
    """Adjacent ranks first: with 4, pair(pair(g0, g1), pair(g2, g3))."""
    while len(values) > 1:
        values = [pair(values[i], values[i + 1]) for i in range(0, len(values), 2)]
    return values[0]


def close(name, got, want, dtype):
    """Horovod's bound for its Adasum tests: relative error of the whole tensor under 100 eps."""
    eps = torch.finfo(dtype).eps
    if got.device.type != DEVICE:
        raise AssertionError("%s: result on %s, want %s" % (name, got.device, DEVICE))
    error = ((got.double().cpu() - want).norm() / want.norm()).item()
    if not error < 100 * eps:
        raise AssertionError("%s: relative error %.3g, bound %.3g" % (name, error, 100 * eps))


def expect_error(name, call, kind, text=""):
    try:
        call()
    except kind as e:
        if text not in str(e):
            raise AssertionError("%s: %r does not say %r" % (name, str(e), text))
        return
    raise AssertionError("%s: expected %s" % (name, kind.__name__))


def allreduces(n, r):
    for dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16):
        shape = (17, 3)
        want = tree([rank_input(k, shape, dtype) for k in range(n)])
        got = hvd.allreduce(mine(r, shape, dtype), op=hvd.Adasum)
        if got.dtype != dtype:
            raise AssertionError("adasum %s came back as %s" % (dtype, got.dtype))
        # Half types round each level's result: their own eps, at most a few roundings deep.
        close("adasum %s" % dtype, got, want, dtype)
    # Grouped: fused into one buffer, each tensor still its own coefficients.
    shapes = [(5,), (4, 4), (300,)]
    outs = hvd.grouped_allreduce([mine(r, s, salt=i) for i, s in enumerate(shapes)],
                                 op=hvd.Adasum)
    for i, (s, out) in enumerate(zip(shapes, outs)):
        close("grouped %d" % i, out, tree([rank_input(k, s, salt=i) for k in range(n)]),
              torch.float64)
    # Parallel gradients average, orthogonal ones add up.
    v = torch.arange(1.0, 9.0, dtype=torch.float64)
    close("parallel", hvd.allreduce(v.to(DEVICE) * (r + 1), op=hvd.Adasum), v * (n + 1) / 2,
          torch.float64)
    e = torch.zeros(n, dtype=torch.float64, device=DEVICE)
    e[r] = r + 1.0
    close("orthogonal", hvd.allreduce(e, op=hvd.Adasum),
          torch.arange(1.0, n + 1, dtype=torch.float64), torch.float64)
    # In place, with Horovod's factors before and after.
    t = mine(r, (9,))
    hvd.allreduce_(t, op=hvd.Adasum, prescale_factor=0.5, postscale_factor=3.0)
    close("scaled", t, 1.5 * tree([rank_input(k, (9,)) for k in range(n)]), torch.float64)


def gradient(n, r):
    """Horovod's backward of an allreduce is the same allreduce of the gradients."""
    x = mine(r, (6,)).requires_grad_()
    weight = mine(r, (6,), salt=5)
    (hvd.allreduce(x, op=hvd.Adasum) * weight).sum().backward()
    close("gradient", x.grad, tree([rank_input(k, (6,), salt=5) for k in range(n)]),
          torch.float64)


def process_set(n, r):
    if n < 4:
        return
    evens = hvd.add_process_set([k for k in range(n) if k % 2 == 0])
    if r % 2 == 0:
        members = list(range(0, n, 2))
        got = hvd.allreduce(mine(r, (7,), salt=9), op=hvd.Adasum, process_set=evens)
        close("process set", got, tree([rank_input(k, (7,), salt=9) for k in members]),
              torch.float64)
    hvd.remove_process_set(evens)


def refusals(n):
    expect_error("integers", lambda: hvd.allreduce(torch.ones(3, dtype=torch.int32),
                                                     op=hvd.Adasum),
                 dtrain.InvalidArgument, "float tensors")
    expect_error("reducescatter", lambda: hvd.reducescatter(torch.ones(2 * n), op=hvd.Adasum),
                 dtrain.InvalidArgument, "Adasum is for allreduce")
    expect_error("predivide", lambda: hvd.DistributedOptimizer(
        torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1), op=hvd.Adasum,
        gradient_predivide_factor=2.0), ValueError, "not supported with op != Average")


STEPS, BATCH, LR, MOMENTUM = 5, 8, 0.1, 0.9


def make_model():
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(10, 12), torch.nn.Tanh(), torch.nn.Linear(12, 3))


def data(k, step):
    g = torch.Generator().manual_seed(100 * step + k)
    return torch.randn(BATCH, 10, generator=g), torch.randint(0, 3, (BATCH,), generator=g)


def loss_of(model, k, step):
    x, y = data(k, step)
    return torch.nn.functional.cross_entropy(model(x), y)


def simulated(n):
    """Adasum's delta optimizer in one process: each rank's own SGD (its momentum its own) steps
    from the shared parameters, and the changes combine by the tree, tensor by tensor."""
    shared = make_model()
    ranks = [copy.deepcopy(shared) for _ in range(n)]
    opts = [torch.optim.SGD(m.parameters(), lr=LR, momentum=MOMENTUM) for m in ranks]
    for step in range(STEPS):
        changes = []
        for k, (m, opt) in enumerate(zip(ranks, opts)):
            m.load_state_dict(shared.state_dict())
            opt.zero_grad()
            loss_of(m, k, step).backward()
            opt.step()
            changes.append([p.detach() - q.detach()
                            for p, q in zip(m.parameters(), shared.parameters())])
        with torch.no_grad():
            for i, p in enumerate(shared.parameters()):
                p.add_(tree([c[i] for c in changes]).to(p.dtype))
    return shared


def distributed_optimizer(n, r):
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM),
                                   named_parameters=model.named_parameters(), op=hvd.Adasum)
    if n > 1:
        expect_error("skip_synchronize", opt.skip_synchronize, AssertionError,
                     "not supported when using Adasum")
    for step in range(STEPS):
        opt.zero_grad()
        loss_of(model, r, step).backward()
        opt.step()
    want = simulated(n)
    for (name, p), q in zip(model.named_parameters(), want.parameters()):
        diff = ((p - q).abs().max() / q.abs().max()).item()
        if not diff < 1e-5:
            raise AssertionError("DistributedOptimizer(op=Adasum) %s: relative difference %.3g"
                                 % (name, diff))


def main():
    torch.set_num_threads(1)
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    if n & (n - 1):
        expect_error("ranks", lambda: hvd.allreduce(torch.ones(3), op=hvd.Adasum),
                     NotImplementedError, "non-power of 2 ranks")
        if hvd.allreduce(torch.ones(3), op=hvd.Sum)[0].item() != n:  # the job goes on
            raise AssertionError("sum after a refused Adasum")
    else:
        allreduces(n, r)
        gradient(n, r)
        process_set(n, r)
        if DEVICE == "cpu":
            refusals(n)
            distributed_optimizer(n, r)
    backend = "mpi" if hvd.mpi_enabled() else "gloo"
    hvd.shutdown()
    print("hvd_adasum OK rank %d of %d (%s)" % (r, n, backend), flush=True)


if __name__ == "__main__":
    sys.exit(main())
