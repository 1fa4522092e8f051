#!/usr/bin/env python3
"""PyTorch DistributedDataParallel (gloo, CPU) reference for dtrain-train's samples/s.

Trains exactly dtrain's networks (src/train/models/lenet.cc, mlp.cc) on the real Fashion-MNIST
with the same per-process batch, SGD (lr 0.05, momentum 0.9) and thread count, and prints one JSON
line with the aggregate steady-state samples/s over all processes. One command starts every
process (torch.multiprocessing, env rendezvous on 127.0.0.1 and a free port; no torchrun):

    OPENBLAS_NUM_THREADS=1 /usr/bin/python3 bench/ddp_train.py --network lenet --workers 2 \
        --batch-size 64 --threads 1 --limit-train 20000

Timing mirrors dtrain-train's progress lines: each process times windows of --log-interval steps;
the first window is warm-up. "samples_per_s" is the sum over processes of the median window speed
(the estimator bench/train_bench.sh applies to dtrain's lines); "span_samples_per_s" is the sum over
processes of (steps after warm-up) * batch / their wall time.

Needs Debian's python3-torch (bash scripts/install-deps.sh); run it with /usr/bin/python3
so that a pyenv or venv python on PATH does not hide the system's torch.
"""
import argparse
import datetime
import gzip
import queue as queue_module
import json
import os
import socket
import statistics
import struct
import sys
import time

# Before numpy/torch load OpenBLAS: one BLAS thread per process (LibTorch's threads do the rest).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402

DATA_DIR = "/usr/share/datasets/fashion-mnist"
MEAN, STD = 0.2860, 0.3530  # as src/train/data/dataset.cc


class LeNet(nn.Module):
    """LeNet-5 with ReLU and max-pooling; padding 2 on 28x28 inputs (src/train/models/lenet.cc)."""

    def __init__(self, channels=1, side=28, classes=10):
        super().__init__()
        pad = 2 if side < 32 else 0
        feat = ((side + 2 * pad - 4) // 2 - 4) // 2
        self.conv1 = nn.Conv2d(channels, 6, 5, padding=pad)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * feat * feat, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = x.flatten(1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class Mlp(nn.Module):
    """784-512-512-10 (src/train/models/mlp.cc)."""

    def __init__(self, inputs=784, classes=10, hidden=512):
        super().__init__()
        self.fc1 = nn.Linear(inputs, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, classes)

    def forward(self, x):
        x = x.flatten(1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, = struct.unpack(">I", data[:4])
    ndim = magic & 0xFF
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load_train(data_dir, limit):
    images = read_idx(os.path.join(data_dir, "train-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(data_dir, "train-labels-idx1-ubyte.gz"))
    if limit > 0:
        images, labels = images[:limit], labels[:limit]
    x = (images.astype(np.float32) / 255.0 - MEAN) / STD
    x = torch.from_numpy(np.ascontiguousarray(x)).unsqueeze(1)  # N x 1 x 28 x 28
    y = torch.from_numpy(labels.astype(np.int64))
    return x, y


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, args, queue):
    torch.set_num_threads(args.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    dist.init_process_group("gloo", rank=rank, world_size=args.workers,
                            timeout=datetime.timedelta(seconds=args.timeout))
    x, y = load_train(args.data_dir, args.limit_train)
    torch.manual_seed(args.seed)
    model = {"lenet": LeNet, "mlp": Mlp}[args.network]()
    # --independent: the same loop with no gradient exchange at all (each process trains alone):
    # the bound any data-parallel trainer on this machine can reach.
    ddp = model if args.independent else DDP(model)  # DDP broadcasts rank 0's initial weights
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=args.momentum)
    sampler = DistributedSampler(range(len(x)), num_replicas=args.workers, rank=rank,
                                 shuffle=True, seed=args.seed, drop_last=True)
    steps_per_epoch = len(sampler) // args.batch_size
    window_speeds, span_samples, span_secs, correct, seen = [], 0, 0.0, 0, 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        order = torch.tensor(list(iter(sampler)), dtype=torch.int64)
        window_start, window_samples = time.perf_counter(), 0
        for step in range(steps_per_epoch):
            idx = order.narrow(0, step * args.batch_size, args.batch_size)
            xb, yb = x.index_select(0, idx), y.index_select(0, idx)
            opt.zero_grad(set_to_none=True)
            logits = ddp(xb)
            loss = F.cross_entropy(logits, yb)
            loss.backward()
            opt.step()
            # dtrain-train does the same per step (its accuracy in the progress line).
            correct += int(logits.argmax(1).eq(yb).sum().item())
            seen += args.batch_size
            window_samples += args.batch_size
            if (step + 1) % args.log_interval == 0:
                now = time.perf_counter()
                secs = now - window_start
                window_speeds.append(window_samples / secs)
                if len(window_speeds) > 1 or epoch > 0:  # the first window is warm-up
                    span_samples += window_samples
                    span_secs += secs
                window_start, window_samples = now, 0
    measured = window_speeds[1:] if len(window_speeds) > 1 else window_speeds
    result = {
        "rank": rank,
        "median_window": statistics.median(measured) if measured else 0.0,
        "span": span_samples / span_secs if span_secs > 0 else 0.0,
        "windows": len(measured),
        "accuracy": correct / max(1, seen),
    }
    gathered = [None] * args.workers
    dist.all_gather_object(gathered, result)
    if rank == 0:
        queue.put(gathered)
    # No destroy_process_group(): tearing gloo down has been seen to hang once a peer is gone; the
    # parent already has the result and ends whatever does not exit by itself.


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--network", choices=["lenet", "mlp"], default="lenet")
    p.add_argument("--workers", type=int, default=1, help="processes")
    p.add_argument("--batch-size", type=int, default=64, help="per process")
    p.add_argument("--threads", type=int, default=1, help="torch threads per process")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--limit-train", type=int, default=20000, help="first N training samples (0: all)")
    p.add_argument("--log-interval", type=int, default=20, help="steps per timing window")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--data-dir", default=DATA_DIR)
    p.add_argument("--independent", action="store_true",
                   help="no DDP: the processes train alone (the bound without communication)")
    p.add_argument("--timeout", type=float, default=120, help="seconds before giving up")
    args = p.parse_args()

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(free_port())
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    context = mp.start_processes(worker, args=(args, results), nprocs=args.workers, join=False,
                                 start_method="spawn")
    deadline = time.monotonic() + args.timeout
    per_rank = None
    while per_rank is None:
        try:
            per_rank = results.get(timeout=1.0)
        except queue_module.Empty:
            failed = [p for p in context.processes if p.exitcode not in (None, 0)]
            if failed or time.monotonic() > deadline:
                for p in context.processes:
                    if p.is_alive():
                        p.terminate()
                why = (f"process exited with code {failed[0].exitcode}" if failed
                       else f"no result after {args.timeout:.0f} s")
                print(f"ddp_train: error: {why}", file=sys.stderr)
                return 1
    for p in context.processes:
        p.join(10)
        if p.is_alive():
            p.terminate()
            p.join(5)
    out = {
        "bench": "ddp_train",
        "mode": "independent" if args.independent else "ddp",
        "network": args.network,
        "workers": args.workers,
        "batch": args.batch_size,
        "threads_per_process": args.threads,
        "torch": torch.__version__,
        "samples_per_s": round(sum(r["median_window"] for r in per_rank), 1),
        "span_samples_per_s": round(sum(r["span"] for r in per_rank), 1),
        "per_process_samples_per_s": [round(r["median_window"], 1) for r in per_rank],
        "windows_per_process": per_rank[0]["windows"],
        "train_accuracy": round(statistics.mean(r["accuracy"] for r in per_rank), 4),
    }
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    sys.exit(main())
