"""One rank of bench/horovod_bench.py: Horovod's API timed the same way whichever library
provides it, real Horovod (`--impl horovod`: `import horovod.torch as hvd`) or dtrain (`--impl
dtrain`: `import dtrain.torch as hvd`). Started by horovodrun, mpirun or `dtrain launch`.

    horovod_rank.py --impl dtrain allreduce --sizes-kb 4,1024 --iterations 20
    horovod_rank.py --impl horovod resnet50 --iterations 10

allreduce: one float32 tensor per size, `hvd.allreduce(..., op=hvd.Sum)` after a barrier (an
allreduce of one element), the median of --iterations. resnet50: the gradient list of a ResNet-50
(161 tensors, 25.6 M parameters, torchvision's layout) submitted at once with allreduce_async
and waited for, as DistributedOptimizer does at the end of backward: the engine fuses them. Rank 0
prints one JSON line per case, with memcpy_ms (one copy of the bytes in this process).
"""

import argparse
import importlib
import json
import statistics
import time

import torch
from bench_timing import median_ms


def resnet50_shapes():
    shapes = [(64, 3, 7, 7), (64,), (64,)]
    inp = 64
    for stage, blocks in enumerate((3, 4, 6, 3)):
        width = 64 << stage
        out = width * 4
        for b in range(blocks):
            for cin, cout, k in ((inp, width, 1), (width, width, 3), (width, out, 1)):
                shapes += [(cout, cin, k, k), (cout,), (cout,)]
            if b == 0:
                shapes += [(out, inp, 1, 1), (out,), (out,)]
            inp = out
    return shapes + [(1000, inp), (1000,)]


def memcpy_ms(nbytes):
    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    times = []
    for _ in range(5):
        start = time.perf_counter()
        dst.copy_(src)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--impl", choices=["horovod", "dtrain"], required=True)
    ap.add_argument("case", choices=["allreduce", "resnet50"])
    ap.add_argument("--sizes-kb", default="4,1024,4096,16384,65536")
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--transport", default="", help="a label for the JSON lines")
    args = ap.parse_args()
    hvd = importlib.import_module("horovod.torch" if args.impl == "horovod" else "dtrain.torch")
    hvd.init()
    torch.set_num_threads(1)
    one = torch.ones(1)

    def barrier():
        hvd.allreduce(one, op=hvd.Sum, name="bench.barrier")

    def report(**fields):
        if hvd.rank() == 0:
            print(json.dumps(dict(impl=args.impl, ranks=hvd.size(), transport=args.transport,
                                  **fields)), flush=True)

    if args.case == "allreduce":
        for kb in (int(s) for s in args.sizes_kb.split(",")):
            tensor = torch.ones(kb * 256)
            hvd.allreduce(tensor, op=hvd.Sum, name="bench.%d" % kb)  # warm up
            ms = median_ms(lambda: hvd.allreduce(tensor, op=hvd.Sum, name="bench.%d" % kb),
                           barrier, args.iterations)
            report(case="allreduce", kb=kb, median_ms=round(ms, 4),
                   memcpy_ms=round(memcpy_ms(kb * 1024), 4))
    else:
        grads = [torch.ones(s) for s in resnet50_shapes()]
        nbytes = sum(g.numel() for g in grads) * 4

        def step():
            handles = [hvd.allreduce_async(g, op=hvd.Average, name="grad.%d" % i)
                       for i, g in enumerate(grads)]
            for h in handles:
                hvd.synchronize(h)

        step()  # warm up
        ms = median_ms(step, barrier, args.iterations)
        report(case="resnet50", tensors=len(grads), mb=round(nbytes / 2**20, 1),
               median_ms=round(ms, 3), memcpy_ms=round(memcpy_ms(nbytes), 3))
    hvd.shutdown()


if __name__ == "__main__":
    main()
