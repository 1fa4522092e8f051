"""A job in which one worker dies mid-training: the others must get an exception naming it
within seconds, never hang.

    fail_worker.py kv|trainer|hvd --victim 1 --after 5 [--stall]

The victim SIGKILLs itself after `after` steps (with --stall it stops stepping instead and sleeps,
so the others wait for it until their deadline). Every other worker keeps stepping until an
exception arrives, prints "CAUGHT <type>: <message>" and exits 3.
"""

import argparse
import os
import signal
import sys
import time

import torch

import dtrain
import dtrain.torch as hvd


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["kv", "trainer", "hvd"])
    ap.add_argument("--victim", type=int, default=1)
    ap.add_argument("--after", type=int, default=5)
    ap.add_argument("--stall", action="store_true")
    args = ap.parse_args()

    if args.mode == "hvd":
        hvd.init()
        rank = hvd.rank()
        step = lambda: hvd.allreduce(torch.ones(1000), name="grad")  # noqa: E731
    elif args.mode == "kv":
        kv = dtrain.kv.create("dist_sync")
        rank = kv.rank
        kv.init(0, torch.zeros(1000))
        out = torch.empty(1000)
        step = lambda: kv.pushpull(0, torch.ones(1000), out=out).wait()  # noqa: E731
    else:
        kv = dtrain.kv.create("dist_sync")
        rank = kv.rank
        net = torch.nn.Linear(10, 2)
        trainer = dtrain.torch.Trainer(net, "sgd", {"learning_rate": 0.1}, kvstore=kv)

        def step():
            net(torch.ones(4, 10)).sum().backward()
            trainer.step(4)

    started = time.monotonic()
    try:
        for i in range(1000000):
            if rank == args.victim and i == args.after:
                if args.stall:
                    time.sleep(60)
                    return 0
                os.kill(os.getpid(), signal.SIGKILL)
            step()
            if time.monotonic() - started > 120:
                print("NO ERROR after 120 s", flush=True)
                return 4
    except dtrain.Error as e:
        print("CAUGHT %s: %s" % (type(e).__name__, e), flush=True)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
