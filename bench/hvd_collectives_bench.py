"""One rank of bench/hvd_collectives_bench.sh: dtrain.torch's allreduce, allgather, alltoall and
reducescatter against torch.distributed's gloo collectives of the same sizes, in the same
processes, alternated size by size so that both see the same machine; and with --ops adasum,
dtrain's Adasum allreduce against torch's sum allreduce (torch has no Adasum).

Started by `dtrain launch -n N -s 0`; torch.distributed meets at 127.0.0.1:--torch-port. Rank 0
prints one JSON line per (op, size): the median milliseconds of --iterations calls of each (a
barrier of each library before every call), speedup = torch / dtrain, and memcpy_ms, the time
to copy the tensor once in this process (the physical floor of a collective that moves it).
"""

import argparse
import json

import torch
import torch.distributed as dist

import dtrain.torch as hvd
from bench_timing import median_ms as timed


def torch_reducescatter(tensor, n):
    """torch.distributed's reduce-scatter over gloo where this torch has one, else what a user
    writes instead: all_reduce and keep this rank's rows."""
    out = torch.empty((tensor.shape[0] // n,) + tuple(tensor.shape[1:]))
    try:
        dist.reduce_scatter_tensor(out, tensor)
        return "reduce_scatter_tensor"
    except (AttributeError, RuntimeError, NotImplementedError):
        pass
    copy = tensor.clone()
    dist.all_reduce(copy)
    rows = tensor.shape[0] // n
    out.copy_(copy[dist.get_rank() * rows:(dist.get_rank() + 1) * rows])
    return "all_reduce+slice"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--torch-port", type=int, required=True)
    parser.add_argument("--sizes-mb", default="1,4,16,64")
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--ops", default="allreduce,allgather,alltoall,reducescatter")
    args = parser.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % args.torch_port, rank=r,
                            world_size=n)
    for mb in [int(s) for s in args.sizes_mb.split(",")]:
        elements = (mb << 20) // 4
        rows = n * 64
        tensor = torch.full((rows, elements // rows), float(r + 1))
        copy_ms = timed(lambda: tensor.clone(), lambda: None, args.iterations)
        for op in args.ops.split(","):
            torch_how = op
            if op == "allreduce":
                ours = lambda: hvd.allreduce(tensor, op=hvd.Sum, name="bench.allreduce")  # noqa
                theirs = lambda: dist.all_reduce(tensor.clone())  # noqa: E731 (same copy)
            elif op == "adasum":
                # torch has no Adasum: the peer is the sum allreduce a user would run instead.
                ours = lambda: hvd.allreduce(tensor, op=hvd.Adasum, name="bench.adasum")  # noqa
                theirs = lambda: dist.all_reduce(tensor.clone())  # noqa: E731
                torch_how = "all_reduce (sum; torch has no Adasum)"
            elif op == "allgather":
                ours = lambda: hvd.allgather(tensor, name="bench.allgather")  # noqa: E731
                theirs = lambda: torch.cat(  # noqa: E731 (the same one tensor out)
                    _all_gather(tensor, n))
            elif op == "alltoall":
                ours = lambda: hvd.alltoall(tensor, name="bench.alltoall")  # noqa: E731
                theirs = lambda: dist.all_to_all_single(torch.empty_like(tensor), tensor)  # noqa
            else:
                ours = lambda: hvd.reducescatter(tensor, op=hvd.Sum,  # noqa: E731
                                                 name="bench.reducescatter")
                torch_how = torch_reducescatter(tensor, n)
                theirs = lambda: torch_reducescatter(tensor, n)  # noqa: E731
            # Alternate which goes first, size by size.
            pair = [("dtrain", ours, hvd.barrier), ("torch", theirs, dist.barrier)]
            if mb % 2:
                pair.reverse()
            result = {}
            for label, call, barrier in pair:
                call()  # warm-up: connections, buffers
                result[label] = timed(call, barrier, args.iterations)
            if r == 0:
                print(json.dumps({
                    "op": op, "mb": mb, "ranks": n, "dtrain_ms": round(result["dtrain"], 3),
                    "torch_gloo_ms": round(result["torch"], 3), "torch_call": torch_how,
                    "speedup": round(result["torch"] / result["dtrain"], 2),
                    "memcpy_ms": round(copy_ms, 3), "torch": torch.__version__}), flush=True)
    hvd.shutdown()


def _all_gather(tensor, n):
    parts = [torch.empty_like(tensor) for _ in range(n)]
    dist.all_gather(parts, tensor)
    return parts


if __name__ == "__main__":
    main()
