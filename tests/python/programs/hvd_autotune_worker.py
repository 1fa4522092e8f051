"""A rank of a training-like loop under Horovod's autotune (HOROVOD_AUTOTUNE=1): each step
allreduces the same 12 named gradients of assorted sizes asynchronously and waits for them all,
as DistributedOptimizer does. Every result must be exact while rank 0 switches the fusion threshold
and cycle time under the ranks (a rank planning its fusion batches with other values than its
peers would reduce the wrong bytes together). Argument: the number of steps. Prints
"hvd_autotune OK rank R: S steps".
"""

import sys

import torch

import dtrain.torch as hvd

SIZES = [1, 1000, 250_000, 3, 70_000, 1_000_000, 17, 400_000, 2_000, 600_000, 5, 120_000]


def main():
    steps = int(sys.argv[1])
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    for step in range(steps):
        handles = [hvd.allreduce_async(torch.full((size,), float(r + step + g)), op=hvd.Sum,
                                       name="grad.%d" % g)
                   for g, size in enumerate(SIZES)]
        for g, (size, h) in enumerate(zip(SIZES, handles)):
            want = float(sum(range(n)) + n * (step + g))
            got = hvd.synchronize(h)
            assert torch.equal(got, torch.full((size,), want)), (step, g, got[:4])
    print("hvd_autotune OK rank %d: %d steps" % (r, steps), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
