"""Blocking calls release the GIL: while this worker waits (joining the job, at a barrier, for a
pull held by a slower worker's round), a Python thread of its own keeps running.

    gil_check.py   # under dtrain launch -n 2: worker 1 sleeps before each step

Worker 0 prints "gil_check OK: the thread ran N times during a 1.5 s wait" when every wait let
the thread run at least 1000 times (a thread starved by a held GIL runs ~0 times).
"""

import sys
import threading
import time

import torch

import dtrain


def main():
    ticks = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            ticks[0] += 1

    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    kv = dtrain.kv.create("dist_sync")
    r = kv.rank
    kv.init(0, torch.zeros(10))
    worst = None
    for what in ("barrier", "pull of a round"):
        if r == 1:
            time.sleep(1.5)
        before = ticks[0]
        if what == "barrier":
            kv.barrier()
        else:
            out = torch.empty(10)
            kv.pushpull(0, torch.ones(10), out=out).wait()
        ran = ticks[0] - before
        if r == 0:
            print("during the %s the thread ran %d times" % (what, ran), flush=True)
            worst = ran if worst is None else min(worst, ran)
    stop.set()
    kv.close()
    if r == 0:
        if worst < 1000:
            print("gil_check FAILED: the thread ran only %d times" % worst, flush=True)
            return 1
        print("gil_check OK: the thread ran at least %d times during each wait" % worst, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
