"""A worker's memory with dtrain.torch.ServerEmbedding does not grow with the table: the same
training step (a batch of ids, an embedding, a small MLP, backward and the rows pushed) with
tables of different sizes on the servers, the worker's peak resident memory and steps/s reported
by rank 0 for each.

    build/src/tools/dtrain launch -n 2 -s 2 -- python3 bench/server_embedding_bench.py \\
        [--rows 1000000,4000000] [--dim 64] [--batch 4096] [--steps 20]

Each size runs in a fresh process group (one launch per size is not needed: the tables are
created one after the other, and ru_maxrss is read after each size's steps).
"""

import argparse
import resource
import time

import torch

import dtrain
import dtrain.torch


def rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", default="1000000,4000000")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    kv = dtrain.kv.create("dist_sync")
    kv.set_optimizer(dtrain.optimizer.create("adagrad", learning_rate=0.01))
    mlp = torch.nn.Sequential(torch.nn.Linear(args.dim, 64), torch.nn.ReLU(),
                              torch.nn.Linear(64, 1))
    for n, rows in enumerate(int(r) for r in args.rows.split(",")):
        emb = dtrain.torch.ServerEmbedding(rows, args.dim, kv, name="table%d" % n)
        gen = torch.Generator().manual_seed(kv.rank)
        start = None
        for step in range(args.steps + 1):
            if step == 1:
                start = time.perf_counter()  # the first step warms up
            ids = torch.randint(0, rows, (args.batch,), generator=gen)
            loss = mlp(emb(ids)).square().mean()
            loss.backward()
            mlp.zero_grad()
        rate = args.steps / (time.perf_counter() - start)
        kv.barrier()
        if kv.rank == 0:
            print("table %d x %d float32 (%.0f MiB on the servers): worker RSS %.0f MiB now, "
                  "%.0f MiB peak; %.1f steps/s (batch %d)"
                  % (rows, args.dim, rows * args.dim * 4 / 2**20, rss_mb(),
                     resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, rate, args.batch),
                  flush=True)
        del emb
    kv.close()


if __name__ == "__main__":
    main()
