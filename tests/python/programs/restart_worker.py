"""A worker that trains a toy 'model' with dtrain.kv and, in its first life as rank 1, kills
itself (SIGKILL) half-way through a round. Under `dtrain launch --max-restarts` its replacement
resumes at kv.rounds_done; every round's pull must be exactly the sum of every rank's push.

    restart_worker.py ROUNDS KILL_AT_ROUND
"""
import os
import signal
import sys

import torch

import dtrain

rounds, kill_at = int(sys.argv[1]), int(sys.argv[2])
kv = dtrain.kv.create("dist_sync")
n = kv.num_workers
keys = [0, 1, 2, 3]
kv.init(keys, [torch.zeros(100 * (k + 1)) for k in keys])  # every process: same keys, same order
first_life = os.environ.get("DTRAIN_RESTART_COUNT", "0") == "0"
if kv.rejoined:
    print("rank %d replaces a lost worker: resuming at round %d" % (kv.rank, kv.rounds_done),
          flush=True)


def pushed(rank, rnd, k):
    return torch.full((100 * (k + 1),), float((rank + 1) * (rnd + 1) + k))


for rnd in range(kv.rounds_done, rounds):
    if first_life and kv.rank == 1 and rnd == kill_at:
        handles = [kv.push(k, pushed(kv.rank, rnd, k)) for k in keys[:2]]
        for h in handles:
            h.wait()  # in the servers' rounds (answered once the other rank pushed too)
        print("rank 1 kills itself half-way through round %d" % rnd, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    outs = [torch.empty(100 * (k + 1)) for k in keys]
    for h in [kv.pushpull(k, pushed(kv.rank, rnd, k), out=outs[k]) for k in keys]:
        h.wait()
    for k in keys:
        want = float((rnd + 1) * n * (n + 1) // 2 + n * k)
        if not torch.all(outs[k] == want):
            print("CHECK FAILED round %d key %d: got %s, want %s" % (rnd, k, outs[k][0].item(), want))
            sys.exit(2)
print("restart_worker OK rank %d, %d rounds" % (kv.rank, rounds), flush=True)
kv.close()
