"""A rank that checks Horovod's PyTorch API on dtrain exactly. Start it N times with
`dtrain launch -n N -s 0` (Gloo) or `mpirun -np N` (OpenMPI). Prints "hvd_worker OK rank R of N
(BACKEND)" at the end; any difference raises and fails the job. With --cuda every tensor is made
on the GPU, and results must come back there with the same values (over NCCL where the job
uses it: "(gloo, nccl)"). With --no-launcher it does not expect horovodrun's variables.
"""

import ctypes
import os
import sys

import torch

import dtrain
import dtrain.torch as hvd


def expect(name, got, want):
    if got.device != want.device:
        raise AssertionError("%s: result on %s, want %s" % (name, got.device, want.device))
    got, want = got.cpu(), want.cpu()
    if got.dtype != want.dtype or not torch.equal(got, want):
        raise AssertionError("%s: got %s %s, want %s %s" % (
            name, got.dtype, got.flatten()[:8].tolist(), want.dtype, want.flatten()[:8].tolist()))


def main():
    if "--cuda" in sys.argv[1:]:
        torch.set_default_device("cuda")
    hvd.init()
    hvd.init()  # again: a no-op
    n, r = hvd.size(), hvd.rank()
    assert 0 <= hvd.local_rank() < hvd.local_size() <= n
    total = float(sum(range(n)))  # every rank contributes its rank
    # dtrain launch sets horovodrun's variables, as hvd sees the job (--no-launcher: started
    # without one, as Kubeflow's PyTorchJob starts its pods).
    if not hvd.mpi_enabled() and "--no-launcher" not in sys.argv[1:]:
        for var, want in (("RANK", r), ("SIZE", n), ("LOCAL_RANK", hvd.local_rank()),
                          ("LOCAL_SIZE", hvd.local_size()), ("CROSS_RANK", hvd.cross_rank()),
                          ("CROSS_SIZE", hvd.cross_size())):
            got = os.environ.get("HOROVOD_" + var)
            assert got == str(want), "HOROVOD_%s=%s, want %d" % (var, got, want)
    assert not hvd.ccl_built() and not hvd.ddl_built() and not hvd.rocm_built()
    assert issubclass(dtrain.PeerError, hvd.HorovodInternalError)
    assert issubclass(dtrain.TimeoutError, hvd.HorovodInternalError)

    # allreduce: average (the default) and sum, float types, new tensor and in place.
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        t = torch.full((3, 5), float(r), dtype=dtype)
        expect("allreduce sum %s" % dtype, hvd.allreduce(t, op=hvd.Sum), torch.full((3, 5), total, dtype=dtype))
        expect("input untouched", t, torch.full((3, 5), float(r), dtype=dtype))
    expect("allreduce average", hvd.allreduce(torch.full((4,), float(r)), name="avg"),
           torch.full((4,), total / n))
    t = torch.full((1000,), float(r))
    assert hvd.allreduce_(t, op=hvd.Sum) is t
    expect("allreduce_ in place", t, torch.full((1000,), total))
    expect("average=False", hvd.allreduce(torch.ones(2), average=False), torch.full((2,), float(n)))
    expect("integer sum", hvd.allreduce(torch.tensor([r, 2 * r]), op=hvd.Sum),
           torch.tensor([int(total), int(2 * total)]))
    # Integers as Horovod reduces them: the average and the scale factors cast toward zero, the
    # prescale on each rank before the sum.
    expect("integer average truncates",
           hvd.allreduce(torch.tensor([r + 1, -75 if r == 0 else 0]), op=hvd.Average),
           torch.tensor([int(sum(range(1, n + 1)) / n), int(-75 / n)]))
    expect("integer prescale on each rank",
           hvd.allreduce(torch.tensor([3]), op=hvd.Sum, prescale_factor=1.5),
           torch.tensor([n * int(3 * 1.5)]))
    expect("integer postscale after the sum",
           hvd.allreduce(torch.tensor([3]), op=hvd.Sum, postscale_factor=1.5),
           torch.tensor([int(3 * n * 1.5)]))
    nc = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()  # not contiguous
    expect("non-contiguous", hvd.allreduce(nc, op=hvd.Sum), nc * n)
    expect("prescale/postscale", hvd.allreduce(torch.ones(3), op=hvd.Sum, prescale_factor=2.0,
                                               postscale_factor=0.5), torch.full((3,), float(n)))
    comp = hvd.allreduce(torch.full((8,), 0.5), op=hvd.Sum, compression=hvd.Compression.fp16)
    expect("fp16 compression", comp, torch.full((8,), 0.5 * n))

    # async: handles, poll, synchronize; submitted in a different order on each rank.
    names = ["async.%d" % i for i in range(6)]
    order = names if r % 2 == 0 else list(reversed(names))
    handles = {nm: hvd.allreduce_async(torch.full((64,), float(i + r)), name=nm, op=hvd.Sum)
               for i, nm in ((names.index(nm), nm) for nm in order)}
    for i, nm in enumerate(names):
        out = hvd.synchronize(handles[nm])
        expect(nm, out, torch.full((64,), float(i * n) + total))
        try:
            hvd.poll(handles[nm])
        except ValueError:
            pass
        else:
            raise AssertionError("poll of a synchronized handle must fail")
    h = hvd.allreduce_async_(torch.ones(10), name="polled")
    while not hvd.poll(h):
        pass
    expect("polled", hvd.synchronize(h), torch.ones(10))
    outs = hvd.grouped_allreduce([torch.full((2,), float(r)), torch.full((3,), 1.0)], op=hvd.Sum)
    expect("grouped 0", outs[0], torch.full((2,), total))
    expect("grouped 1", outs[1], torch.full((3,), float(n)))

    # allgather: the first dimension differs per rank; any dtype.
    mine = torch.full((r + 1, 2), float(r))
    want = torch.cat([torch.full((k + 1, 2), float(k)) for k in range(n)])
    expect("allgather uneven", hvd.allgather(mine), want)
    expect("allgather int64", hvd.allgather(torch.tensor([r, -r], dtype=torch.int64)),
           torch.tensor([v for k in range(n) for v in (k, -k)], dtype=torch.int64))
    expect("allgather bool", hvd.allgather(torch.tensor([r % 2 == 0])),
           torch.tensor([k % 2 == 0 for k in range(n)]))
    expect("allgather uint8 odd rows", hvd.allgather(torch.full((1, 3), r, dtype=torch.uint8)),
           torch.tensor([[k] * 3 for k in range(n)], dtype=torch.uint8))

    # broadcast from the last rank (non-zero when n > 1): new tensor, in place, other dtypes.
    root = n - 1
    expect("broadcast", hvd.broadcast(torch.full((5,), float(r)), root), torch.full((5,), float(root)))
    t = torch.full((2, 2), float(r), dtype=torch.float64)
    hvd.broadcast_(t, root, name="bcast.inplace")
    expect("broadcast_", t, torch.full((2, 2), float(root), dtype=torch.float64))
    expect("broadcast int64", hvd.broadcast(torch.tensor([r * 7, 3]), root),
           torch.tensor([root * 7, 3]))
    expect("broadcast scalar", hvd.broadcast(torch.tensor(float(r)), root), torch.tensor(float(root)))
    assert hvd.broadcast_object({"rank": r, "list": [r] * 3}, root_rank=root) == \
        {"rank": root, "list": [root] * 3}
    assert hvd.allgather_object(("r", r)) == [("r", k) for k in range(n)]

    # broadcast_parameters / broadcast_optimizer_state: every rank ends with root's.
    torch.manual_seed(100 + r)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * (r + 1), momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=root)
    hvd.broadcast_optimizer_state(opt, root_rank=root)
    flat = torch.cat([p.detach().flatten() for p in model.state_dict().values()
                      if p.dtype == torch.float32])
    gathered = hvd.allgather(flat.unsqueeze(0))
    for k in range(n):
        expect("parameters of rank %d after broadcast" % k, gathered[k], gathered[0])
    assert opt.param_groups[0]["lr"] == 0.1 * (root + 1)

    # join: rank k runs k + 1 steps; ranks out of data take part with zeros.
    for step in range(r + 1):
        got = hvd.allreduce(torch.ones(3), name="join.step.%d" % step, op=hvd.Sum)
        expect("allreduce with %d ranks joined" % step, got, torch.full((3,), float(n - step)))
    last = hvd.join()
    assert last == n - 1, "join returned %d, want %d" % (last, n - 1)
    hvd.barrier()

    # Errors.
    for bad, kind in ((lambda: hvd.allreduce(torch.ones(1), op=99), ValueError),
                      (lambda: hvd.synchronize(123456), ValueError),
                      (lambda: hvd.allgather(torch.tensor(1.0)), ValueError)):
        try:
            bad()
        except kind:
            pass
        else:
            raise AssertionError("expected %s" % kind.__name__)
    if n > 1:
        try:  # ranks disagree on a shape: every rank gets an error describing each rank's
            hvd.allreduce(torch.ones(r + 1), name="mismatch")
        except ValueError as e:
            assert "rank 0" in str(e) and "rank 1" in str(e), e
        else:
            raise AssertionError("a shape mismatch between ranks was not reported")

    if hvd.mpi_enabled():
        # Waiting MPI calls yield the core (mpi_backend.cc sets Open MPI's variable before
        # MPI_Init) unless the user set it: the process's environment says which took effect.
        libc = ctypes.CDLL(None)
        libc.getenv.restype = ctypes.c_char_p
        want = os.environ.get("OMPI_MCA_mpi_yield_when_idle", "1")  # as the process started
        got = libc.getenv(b"OMPI_MCA_mpi_yield_when_idle")
        assert got == want.encode(), "OMPI_MCA_mpi_yield_when_idle is %r, want %r" % (got, want)

    backend = "mpi" if hvd.mpi_enabled() else "gloo"
    if "--cuda" in sys.argv[1:] and dtrain._dtrain.collectives_nccl_enabled():
        backend += ", nccl"  # CUDA tensors went over NCCL: the engine refuses them otherwise
    hvd.shutdown()
    print("hvd_worker OK rank %d of %d (%s)" % (r, n, backend), flush=True)


if __name__ == "__main__":
    sys.exit(main())
