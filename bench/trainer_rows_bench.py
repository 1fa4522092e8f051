"""dtrain.torch.Trainer on a model with a big embedding table, the table's gradient sparse
(nn.Embedding(sparse=True): it travels as rows, each forward pulls the rows it reads) against the
same model with a dense table (the whole table pushed and pulled each step, which is also what
the Trainer did with sparse gradients before they travelled as rows). Each mode is one job
(`dtrain launch -n N -s S`) of the same steps; this script starts both, alternated, and prints
steps per second, their ratio, and the bytes a worker moves a step.

    python3 bench/trainer_rows_bench.py [--workers 2] [--servers 2] [--rows 1000000] [--dim 64]
        [--batch 2048] [--steps 10] [--repeat 2]

The servers run SGD with momentum (MXNet's lazy_update for the rows).
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
DTRAIN = os.environ.get("DTRAIN", os.path.join(HERE, "..", "build", "src", "tools", "dtrain"))


class Model(torch.nn.Module):
    def __init__(self, rows, dim, sparse):
        super().__init__()
        self.emb = torch.nn.EmbeddingBag(rows, dim, mode="sum", sparse=sparse)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 64), torch.nn.ReLU(),
                                       torch.nn.Linear(64, 1))

    def forward(self, ids):
        return self.mlp(self.emb(ids)).squeeze(1)


def worker(args):
    import dtrain
    import dtrain.torch

    torch.manual_seed(0)
    net = Model(args.rows, args.dim, bool(args.sparse))
    trainer = dtrain.torch.Trainer(net, "sgd", {"learning_rate": 0.05, "momentum": 0.9})
    rank = trainer.kvstore.rank
    gen = torch.Generator().manual_seed(rank)
    times = []
    for step in range(args.steps + 1):  # the first step warms up
        ids = torch.randint(0, args.rows, (args.batch, 4), generator=gen)
        y = torch.randn(args.batch, generator=gen)
        start = time.perf_counter()
        ((net(ids) - y) ** 2).sum().backward()
        trainer.step(args.batch)
        if step:
            times.append(time.perf_counter() - start)
    trainer.wait()
    if rank == 0:
        print("STEP_S %.6f" % statistics.median(times), flush=True)
    trainer.close()


def run_mode(args, sparse):
    argv = [DTRAIN, "launch", "-n", str(args.workers), "-s", str(args.servers), "--",
            sys.executable, os.path.abspath(__file__), "--worker", "--sparse", str(sparse),
            "--rows", str(args.rows), "--dim", str(args.dim), "--batch", str(args.batch),
            "--steps", str(args.steps)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=1200)
    m = re.search(r"STEP_S ([0-9.]+)", out.stdout + out.stderr)
    if out.returncode != 0 or not m:
        sys.exit("the %s job failed:\n%s" % ("sparse" if sparse else "dense",
                                             (out.stdout + out.stderr)[-3000:]))
    return float(m.group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--sparse", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    runs = {1: [], 0: []}
    for _ in range(args.repeat):
        for sparse in (1, 0):
            runs[sparse].append(run_mode(args, sparse))
    rows_s, dense_s = (statistics.median(runs[k]) for k in (1, 0))
    table_mib = args.rows * args.dim * 4 / 2**20
    touched = args.batch * 4
    print("table %d x %d float32 (%.0f MiB), batch %d of 4 ids, %d workers x %d servers, "
          "median step of %d, %d jobs each" % (args.rows, args.dim, table_mib, args.batch,
                                              args.workers, args.servers, args.steps, args.repeat))
    print("rows:  %7.2f ms a step (%.1f steps/s), at most %.2f MiB of table a worker moves"
          % (rows_s * 1e3, 1 / rows_s, 2 * touched * (args.dim * 4 + 8) / 2**20))
    print("dense: %7.2f ms a step (%.1f steps/s), %.0f MiB of table a worker moves"
          % (dense_s * 1e3, 1 / dense_s, 2 * table_mib))
    print("rows are %.1fx faster" % (dense_s / rows_s))


if __name__ == "__main__":
    main()
