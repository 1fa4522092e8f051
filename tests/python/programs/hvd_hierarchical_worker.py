"""A rank that checks Horovod's hierarchical allreduce (HOROVOD_HIERARCHICAL_ALLREDUCE=1) on CUDA
tensors over NCCL exactly: sums, averages, min, max and product in every float dtype, counts that
do not split evenly into shards, fused groups, in place and submitted in different orders.
Prints "hvd_hierarchical OK rank R of N". Only allreduces: an allgather or broadcast needs NCCL's
communicator of every rank, which two ranks on one GPU cannot have.

test_gpu.py starts it under `unshare --pid` so that two ranks on one GPU count as two hosts (each
pid namespace is a host to dtrain's memory sharing and to the hierarchy, common/host_id.h;
Horovod's local_size still counts hostnames): each host's NCCL communicator then has one rank, and
the shards cross between the "hosts" through host memory over Gloo.
"""

import torch

import dtrain.torch as hvd


def expect(name, got, want):
    if got.device.type != "cuda":
        raise AssertionError("%s: result on %s, want the GPU" % (name, got.device))
    got = got.cpu()
    if got.dtype != want.dtype or not torch.equal(got, want):
        raise AssertionError("%s: got %s %s, want %s %s" % (
            name, got.dtype, got.flatten()[:8].tolist(), want.dtype, want.flatten()[:8].tolist()))


def values(count, rank, dtype):
    """Small integers, so that every dtype and every order of summing is exact."""
    return ((torch.arange(count, dtype=torch.float64) % 17) + rank).to(dtype)


def main():
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    torch.cuda.set_device(0)

    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        for count in (1, 7, 1000, 4099):
            sum_want = sum(values(count, k, torch.float64) for k in range(n)).to(dtype)
            got = hvd.allreduce(values(count, r, dtype).cuda(), op=hvd.Sum,
                                name="sum.%s.%d" % (dtype, count))
            expect("sum of %d %s" % (count, dtype), got, sum_want)
    # Averages of 2k: exact in every dtype for these sizes.
    got = hvd.allreduce(torch.full((333,), 2.0 * r, device="cuda"), name="avg")
    expect("average", got, torch.full((333,), float(n - 1)))
    expect("min", hvd.allreduce(torch.full((9,), 5.0 - r, device="cuda"), op=hvd.Min),
           torch.full((9,), 5.0 - (n - 1)))
    expect("max", hvd.allreduce(torch.full((9,), 5.0 - r, device="cuda"), op=hvd.Max),
           torch.full((9,), 5.0))
    expect("product", hvd.allreduce(torch.full((9,), 2.0, device="cuda"), op=hvd.Product),
           torch.full((9,), 2.0 ** n))

    t = values(12345, r, torch.float32).cuda()
    assert hvd.allreduce_(t, op=hvd.Sum) is t
    expect("in place", t, sum(values(12345, k, torch.float32) for k in range(n)))
    outs = hvd.grouped_allreduce([values(c, r, torch.float32).cuda() for c in (3, 5, 1001)],
                                 op=hvd.Sum)
    for c, out in zip((3, 5, 1001), outs):
        expect("grouped %d" % c, out, sum(values(c, k, torch.float32) for k in range(n)))
    # Submitted in opposite orders on alternate ranks: the engine fuses what is ready.
    names = ["async.%d" % i for i in range(8)]
    order = names if r % 2 == 0 else list(reversed(names))
    handles = {nm: hvd.allreduce_async(values(100 + names.index(nm), r, torch.float32).cuda(),
                                       name=nm, op=hvd.Sum) for nm in order}
    for i, nm in enumerate(names):
        expect(nm, hvd.synchronize(handles[nm]),
               sum(values(100 + i, k, torch.float32) for k in range(n)))
    print("hvd_hierarchical OK rank %d of %d" % (r, n), flush=True)


if __name__ == "__main__":
    main()
