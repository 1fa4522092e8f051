"""A rank that starts and stops dtrain.torch again and again, as Horovod's elastic mode and many
test suites do between cases: each cycle is init, one allreduce, shutdown. Argument: the number
of cycles. Prints "hvd_cycles OK rank R: C cycles".
"""

import sys
import time

import torch

import dtrain.torch as hvd


def main():
    cycles = int(sys.argv[1])
    began = time.monotonic()
    for cycle in range(cycles):
        hvd.init()
        n, r = hvd.size(), hvd.rank()
        got = hvd.allreduce(torch.full((4,), float(r + cycle)), op=hvd.Sum, name="cycle")
        want = float(sum(range(n)) + n * cycle)
        assert torch.equal(got, torch.full((4,), want)), (cycle, got)
        hvd.shutdown()
        assert not hvd.is_initialized()
    print("hvd_cycles OK rank %d: %d cycles in %.1f s" % (r, cycles, time.monotonic() - began),
          flush=True)


if __name__ == "__main__":
    main()
