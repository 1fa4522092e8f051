#!/usr/bin/env python3
"""Training throughput of dtrain's Python API, for bench/python_bench.sh: the same networks,
data, batch, optimizer and timing windows as bench/ddp_train.py (PyTorch DDP), so the numbers
compare one to one.

    dtrain launch -n 2 -s 2 -- python3 bench/python_train.py trainer --network lenet
    dtrain launch -n 2 -s 0 -- python3 bench/python_train.py hvd --network lenet     # Gloo
    mpirun -np 2 python3 bench/python_train.py hvd --network lenet                   # OpenMPI

`trainer`: dtrain.torch.Trainer over a dist_sync KVStore (sum loss and step(batch), as Gluon).
`hvd`: torch's SGD wrapped in dtrain.torch.DistributedOptimizer (Horovod's API).
Every rank prints one JSON line {"rank", "median_window", "span", "windows"}: samples/s of its
median timing window after the first (warm-up), and over the whole measured span.
"""

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddp_train import DATA_DIR, LeNet, Mlp, load_train  # noqa: E402

import dtrain  # noqa: E402
import dtrain.torch as hvd  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["trainer", "hvd"])
    p.add_argument("--network", choices=["lenet", "mlp"], default="lenet")
    p.add_argument("--kvstore", default="dist_sync")
    p.add_argument("--batch-size", type=int, default=64, help="per process")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--limit-train", type=int, default=20000)
    p.add_argument("--log-interval", type=int, default=20)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--data-dir", default=DATA_DIR)
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    torch.manual_seed(args.seed)
    model = {"lenet": LeNet, "mlp": Mlp}[args.network]()
    if args.mode == "trainer":
        kv = dtrain.kv.create(args.kvstore)
        rank, workers = kv.rank, kv.num_workers
        trainer = dtrain.torch.Trainer(model, "sgd", {"learning_rate": args.lr,
                                                      "momentum": args.momentum}, kvstore=kv)
    else:
        hvd.init()
        rank, workers = hvd.rank(), hvd.size()
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum),
            named_parameters=model.named_parameters())

    x, y = load_train(args.data_dir, args.limit_train)
    part = len(x) // workers
    g = torch.Generator().manual_seed(args.seed)
    order = rank * part + torch.randperm(part, generator=g)
    steps = part // args.batch_size
    speeds, span_samples, span_secs = [], 0, 0.0
    start, samples = time.perf_counter(), 0
    for step in range(steps):
        idx = order.narrow(0, step * args.batch_size, args.batch_size)
        xb, yb = x.index_select(0, idx), y.index_select(0, idx)
        if args.mode == "trainer":
            logits = model(xb)
            F.cross_entropy(logits, yb, reduction="sum").backward()
            trainer.step(args.batch_size)
        else:
            opt.zero_grad(set_to_none=False)
            logits = model(xb)
            F.cross_entropy(logits, yb).backward()
            opt.step()
        int(logits.argmax(1).eq(yb).sum().item())  # as dtrain-train and ddp_train.py do per step
        samples += args.batch_size
        if (step + 1) % args.log_interval == 0:
            now = time.perf_counter()
            speeds.append(samples / (now - start))
            if len(speeds) > 1:
                span_samples += samples
                span_secs += now - start
            start, samples = now, 0
    measured = speeds[1:] if len(speeds) > 1 else speeds
    print(json.dumps({"rank": rank, "median_window": statistics.median(measured) if measured else 0,
                      "span": span_samples / span_secs if span_secs else 0,
                      "windows": len(measured)}), flush=True)
    if args.mode == "trainer":
        trainer.close()
        kv.close()


if __name__ == "__main__":
    main()
