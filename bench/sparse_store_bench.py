"""An embedding table's step on a dist_sync store: only the rows a batch touches (a sparse COO
gradient pushed, as nn.Embedding(sparse=True) gives, and row_sparse_pull of the same rows)
against the whole table dense (push and pull), in the same job. Rank 0 prints the medians, their
ratio, and the bytes each step moves per worker.

    build/src/tools/dtrain launch -n 2 -s 2 -- python3 bench/sparse_store_bench.py \\
        [--rows 1000000] [--dim 64] [--touched 2048] [--steps 10]

The servers run SGD with momentum (lazy_update, MXNet's default for row-sparse gradients).
"""

import argparse
import statistics
import time

import torch

import dtrain


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--touched", type=int, default=2048, help="distinct rows per step")
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    kv = dtrain.kv.create("dist_sync")
    table = torch.zeros(args.rows, args.dim)
    kv.init("dense", table)
    kv.init("sparse", table)
    kv.set_optimizer(dtrain.optimizer.create("sgd", learning_rate=0.01, momentum=0.9))
    gen = torch.Generator().manual_seed(kv.rank)
    times = {"sparse": [], "dense": []}
    for step in range(args.steps + 1):  # the first step of each warms up
        ids = torch.randperm(args.rows, generator=gen)[:args.touched]
        grad = torch.sparse_coo_tensor(ids.unsqueeze(0), torch.randn(args.touched, args.dim,
                                                                     generator=gen),
                                       (args.rows, args.dim))
        kv.barrier()
        start = time.perf_counter()
        kv.push("sparse", grad)
        kv.row_sparse_pull("sparse", row_ids=ids)
        sparse_s = time.perf_counter() - start
        kv.barrier()
        start = time.perf_counter()
        kv.push("dense", grad.to_dense())
        out = torch.empty(args.rows, args.dim)
        kv.pull("dense", out=out).wait()
        dense_s = time.perf_counter() - start
        if step:
            times["sparse"].append(sparse_s)
            times["dense"].append(dense_s)
    if kv.rank == 0:
        sparse, dense = (statistics.median(times[k]) * 1e3 for k in ("sparse", "dense"))
        row_bytes = args.dim * 4
        print(f"table {args.rows} x {args.dim} float32 ({args.rows * row_bytes / 2**20:.0f} MiB), "
              f"{args.touched} rows a step, {kv.num_workers} workers, median of {args.steps}")
        print(f"sparse step {sparse:.2f} ms ({2 * args.touched * (row_bytes + 8) / 2**20:.2f} MiB "
              f"a worker moves), dense step {dense:.1f} ms "
              f"({2 * args.rows * row_bytes / 2**20:.0f} MiB): sparse is {dense / sparse:.0f}x "
              f"faster")
    kv.close()


if __name__ == "__main__":
    main()
