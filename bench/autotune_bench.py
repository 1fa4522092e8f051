"""Horovod's autotune against the hand-tuned defaults: examples/python/horovod_mnist.py (LeNet on
Fashion-MNIST, dtrain.torch's DistributedOptimizer) as one `dtrain launch -n N -s 0` job with the
defaults and one with `--autotune`, alternated, each for one epoch. Prints, per mode, the median
samples/s of rank 0 over the whole epoch (the search's samples included) and over the epoch's
last logged batches (after the search, some 200-230 steps with the defaults), their ratios, the
values autotune chose each time, and Test_acc (the values must not change the arithmetic).

    python3 bench/autotune_bench.py [--workers 2] [--repeat 3] [--max-batches 0]
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DTRAIN = os.environ.get("DTRAIN", os.path.join(REPO, "build", "src", "tools", "dtrain"))
EXAMPLE = os.path.join(REPO, "examples", "python", "horovod_mnist.py")
SPEED = re.compile(r"\[worker 0\] Epoch\[0\] Batch \[(\d+)-(\d+)\] Speed: ([\d.]+) samples/sec")


def run(workers, autotune, max_batches, log_interval):
    log = tempfile.NamedTemporaryFile(suffix=".csv", delete=False).name
    flags = ["--autotune", "--autotune-log-file", log] if autotune else []
    argv = [DTRAIN, "launch", "-n", str(workers), "-s", "0", *flags, "--", sys.executable,
            EXAMPLE, "--epochs", "1", "--log-interval", str(log_interval),
            "--max-batches", str(max_batches)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run(argv, capture_output=True, text=True, timeout=900, env=env)
    if p.returncode != 0:
        sys.exit("autotune_bench: %s failed:\n%s%s" % (" ".join(argv), p.stdout, p.stderr))
    speeds = [(int(m[2]), float(m[3])) for m in SPEED.finditer(p.stdout)]
    if len(speeds) < 2:
        sys.exit("autotune_bench: too few speed lines (raise --max-batches):\n" + p.stdout)
    # The example's speed is cumulative from the epoch's start: the last two lines give the rate
    # of the batches between them.
    (b1, s1), (b2, s2) = speeds[-2], speeds[-1]
    tail = (b2 - b1) / (b2 / s2 - b1 / s1)
    acc = re.search(r"Test_acc ([\d.]+)", p.stdout)
    chosen = ""
    if autotune:
        best = [line for line in open(log) if line.startswith("best,")]
        chosen = best[-1].strip() if best else "(the search did not finish)"
    os.unlink(log)
    return s2, tail, acc[1] if acc else "?", chosen


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--max-batches", type=int, default=0, help="0: the whole epoch")
    ap.add_argument("--log-interval", type=int, default=100)
    args = ap.parse_args()
    results = {False: [], True: []}
    for i in range(args.repeat):
        for autotune in (False, True):
            whole, tail, acc, chosen = run(args.workers, autotune, args.max_batches,
                                           args.log_interval)
            results[autotune].append((whole, tail))
            print("run %d %-8s epoch %8.0f samples/s, last batches %8.0f samples/s, Test_acc %s %s"
                  % (i + 1, "autotune" if autotune else "default", whole, tail, acc, chosen),
                  flush=True)
    med = {k: (statistics.median(w for w, _ in v), statistics.median(t for _, t in v))
           for k, v in results.items()}
    print("median default  epoch %.0f, last batches %.0f samples/s" % med[False])
    print("median autotune epoch %.0f, last batches %.0f samples/s" % med[True])
    print("autotune / default: epoch %.3f, last batches %.3f" % (
        med[True][0] / med[False][0], med[True][1] / med[False][1]))


if __name__ == "__main__":
    main()
