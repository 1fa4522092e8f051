#!/usr/bin/env python3
"""What synchronising a data-parallel step costs, apart from the bytes: one training loop (LeNet or
the 784-512-512-10 MLP on Fashion-MNIST, batch 64, SGD, one thread a rank) whose steps end in turn,
20 steps each, with
  none      no communication at all (the ranks drift apart: the no-communication bound),
  barrier   a barrier polled through a shared-memory file (no thread wakes anyone: what a step's
            synchronisation alone costs on this host),
  tiny      one 4-byte allreduce of dtrain's (the same synchronisation through the engine),
  flat      one allreduce of all gradients copied into one buffer,
  grouped   one allreduce per gradient, submitted together after backward (as the hooks of
            Horovod's DistributedOptimizer do during it).
Taking turns within one job cancels the drift of a busy host between runs, which on 2 cores is
larger than what is measured (docs/performance.md, "Waiting callers poll before they sleep").
Rank 0 prints one JSON line: per case the mean step and the mean wait after backward, in ms.

    dtrain launch -n 2 -s 0 -- python3 bench/step_waits.py --network mlp
    mpirun -np 2 --bind-to none python3 bench/step_waits.py --network lenet --epochs 3
    dtrain launch -n 2 -s 0 --env DTRAIN_SPIN_WAIT_US:0 -- python3 bench/step_waits.py
"""
import argparse
import json
import mmap
import os
import statistics
import struct
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddp_train import DATA_DIR, LeNet, Mlp, load_train  # noqa: E402

import dtrain.torch as hvd  # noqa: E402

CASES = ["none", "barrier", "tiny", "flat", "grouped"]
TURN = 20  # steps per turn; the first 2 of each turn are not counted (the switch)


class PolledBarrier:
    """Two ranks' barrier through a file in /dev/shm: each bumps its counter and polls the other's,
    yielding the core meanwhile. No thread sleeps, so no wake-up is paid for."""

    def __init__(self, rank, job):
        self.rank, self.count = rank, 0
        path = "/dev/shm/dtrain-step-waits-%s" % job
        with open(path, "a+b") as f:
            f.truncate(16)
            self.map = mmap.mmap(f.fileno(), 16)
        hvd.barrier()  # both have mapped it
        if rank == 0:
            os.unlink(path)

    def wait(self):
        self.count += 1
        struct.pack_into("q", self.map, self.rank * 8, self.count)
        while struct.unpack_from("q", self.map, (1 - self.rank) * 8)[0] < self.count:
            os.sched_yield()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--network", choices=["lenet", "mlp"], default="mlp")
    p.add_argument("--epochs", type=int, default=2, help="passes over each rank's half")
    p.add_argument("--limit-train", type=int, default=60000)
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--data-dir", default=DATA_DIR)
    args = p.parse_args()
    cases = args.cases.split(",")
    unknown = set(cases) - set(CASES)
    if unknown:
        p.error("unknown cases %s (known: %s)" % (", ".join(sorted(unknown)), ", ".join(CASES)))

    torch.set_num_threads(1)
    torch.manual_seed(42)
    model = {"lenet": LeNet, "mlp": Mlp}[args.network]()
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    if size != 2:
        sys.exit("step_waits: 2 ranks, not %d (its barrier is for two)" % size)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    params = list(model.parameters())
    flat = torch.zeros(sum(q.numel() for q in params))
    job = hvd.broadcast_object(os.getpid(), root_rank=0, name="step_waits.job")
    barrier = PolledBarrier(rank, job)

    x, y = load_train(args.data_dir, args.limit_train)
    part = len(x) // size
    order = rank * part + torch.randperm(part, generator=torch.Generator().manual_seed(42))
    steps = {c: [] for c in cases}
    waits = {c: [] for c in cases}
    for _ in range(args.epochs):
        for step in range(part // 64):
            case = cases[(step // TURN) % len(cases)]
            idx = order.narrow(0, step * 64, 64)
            xb, yb = x.index_select(0, idx), y.index_select(0, idx)
            start = time.perf_counter()
            opt.zero_grad(set_to_none=False)
            F.cross_entropy(model(xb), yb).backward()
            backward_end = time.perf_counter()
            if case == "barrier":
                barrier.wait()
            elif case == "tiny":
                hvd.allreduce(torch.zeros(1), op=hvd.Sum, name="tiny")
            elif case == "flat":
                torch.cat([q.grad.reshape(-1) for q in params], out=flat)
                hvd.allreduce_(flat, op=hvd.Average, name="flat")
                offset = 0
                for q in params:
                    q.grad.reshape(-1).copy_(flat[offset:offset + q.numel()])
                    offset += q.numel()
            elif case == "grouped":
                hvd.grouped_allreduce_([q.grad for q in params], op=hvd.Average, name="grouped")
            waited = time.perf_counter()
            opt.step()
            if step % TURN >= 2:
                steps[case].append(time.perf_counter() - start)
                waits[case].append(waited - backward_end)
    if rank == 0:
        report = {"bench": "step_waits", "network": args.network, "ranks": size,
                  "spin_wait_us": os.environ.get("DTRAIN_SPIN_WAIT_US", "default")}
        for c in cases:
            report[c] = {"step_ms": round(statistics.mean(steps[c]) * 1e3, 3),
                         "wait_ms": round(statistics.mean(waits[c]) * 1e3, 3),
                         "steps": len(steps[c])}
        print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
