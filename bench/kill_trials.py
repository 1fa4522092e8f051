#!/usr/bin/env python3
"""Random kill -9 trials of a parameter-server job under `dtrain launch --max-restarts`.

Each trial runs the main job (2 workers, 2 servers, dist_sync LeNet on Fashion-MNIST, seed 7) and
SIGKILLs 1 to MAX_RESTARTS of its members, each a worker or a server of either rank chosen at
random, at random moments of its training (a victim that is not running at that moment, because
its replacement is still starting, is drawn again). A trial passes when the job exits 0 and
prints its final Test_acc; the script reports every kill, the time from each kill to the next
progress line of the job, and the final Test_acc against an undisturbed run of the same job.
Then FAIL_FAST trials with `--max-restarts 0`: one member killed; the job must exit non-zero,
naming the lost member, in under a second.

    python3 bench/kill_trials.py [--trials 20] [--max-restarts 3] [--fail-fast 5] [--epochs 1]
                                 [--seed 1]
"""
import argparse
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from restart_bench import member_pid  # noqa: E402  (the bench folder is no package)

VICTIMS = [("worker", 0), ("worker", 1), ("server", 0), ("server", 1)]


def launch(args: argparse.Namespace, restarts: int) -> subprocess.Popen:
    argv = [args.dtrain, "launch", "-n", "2", "-s", "2", "--launcher", "local",
            "--max-restarts", str(restarts), "--", args.train, "--dataset", "fashion-mnist",
            "--network", "lenet", "--kvstore", "dist_sync", "--epochs", str(args.epochs),
            "--seed", "7", "--log-interval", "50"]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def run(args: argparse.Namespace, restarts: int, kill_at: list[float],
        victims: list[tuple[str, int]] | None = None) -> dict:
    """Runs the job, killing a random member (or victims[i]) at each of kill_at (seconds after
    the first progress line). Returns the exit code, the lines with their times, and the kills."""
    start = time.monotonic()
    proc = launch(args, restarts)
    lines: list[tuple[float, str]] = []
    kills: list[tuple[float, str, int]] = []
    rng = random.Random(args.rng.random())

    def killer() -> None:
        while not any("Batch [" in l for _, l in lines):
            if proc.poll() is not None:
                return
            time.sleep(0.02)
        t0 = time.monotonic()
        for i, at in enumerate(kill_at):
            while time.monotonic() - t0 < at:
                if proc.poll() is not None:
                    return
                time.sleep(0.01)
            for _ in range(200):  # a victim being replaced has no process yet: draw again
                role, rank = victims[i] if victims else rng.choice(VICTIMS)
                pid = member_pid(role, rank)
                if pid is not None:
                    kills.append((time.monotonic() - start, role, rank))
                    os.kill(pid, signal.SIGKILL)
                    break
                time.sleep(0.01)

    threading.Thread(target=killer, daemon=True).start()
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            lines.append((time.monotonic() - start, line.rstrip("\n")))
        code = proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    acc = None
    for _, l in lines:
        m = re.match(rf"\[worker 0\] Epoch {args.epochs - 1}: Test_acc ([0-9.]+)", l)
        if m:
            acc = float(m.group(1))
    return {"code": code, "lines": lines, "kills": kills, "test_acc": acc,
            "wall_s": time.monotonic() - start}


def training_again_after(result: dict, kill_s: float) -> float | None:
    """Seconds from a kill to the next progress line of any worker after the loss was seen."""
    seen = False
    for t, l in result["lines"]:
        if t < kill_s:
            continue
        if "lost" in l or "replac" in l or "restor" in l:
            seen = True
        elif seen and "Batch [" in l:
            return t - kill_s
    return None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--max-restarts", type=int, default=3)
    p.add_argument("--fail-fast", type=int, default=5)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--dtrain", default="build/src/tools/dtrain")
    p.add_argument("--train", default="build/src/train/dtrain-train")
    p.add_argument("--kills", help="one trial with these kills instead, e.g. "
                   "'worker 0@2.9,server 1@3.4' (seconds after the first progress line)")
    p.add_argument("--log", help="with --kills: write the job's output here")
    args = p.parse_args()
    args.rng = random.Random(args.seed)
    if args.kills:
        plan = [(k.split("@")[0].split()[0], int(k.split("@")[0].split()[1]),
                 float(k.split("@")[1])) for k in args.kills.split(",")]
        r = run(args, args.max_restarts, [t for _, _, t in plan], [(a, b) for a, b, _ in plan])
        if args.log:
            with open(args.log, "w") as f:
                f.write("\n".join(f"{t:8.3f} {l}" for t, l in r["lines"]) + "\n")
        print(f"exit {r['code']}, Test_acc {r['test_acc']}, kills {r['kills']}")
        return 0 if r["code"] == 0 else 1

    base = run(args, args.max_restarts, [])
    first = next(t for t, l in base["lines"] if "Batch [" in l)
    train_s = base["wall_s"] - first
    print(f"undisturbed: exit {base['code']}, {base['wall_s']:.1f} s ({train_s:.1f} s after the "
          f"first progress line), Test_acc {base['test_acc']}", flush=True)
    if base["code"] != 0 or base["test_acc"] is None:
        sys.stderr.write("\n".join(l for _, l in base["lines"][-30:]) + "\n")
        return 1

    passed = 0
    back: list[float] = []
    diffs: list[float] = []
    for trial in range(args.trials):
        n = args.rng.randint(1, args.max_restarts)
        # Kills spread over the first 80% of the training, in order.
        kill_at = sorted(args.rng.uniform(0.2, 0.8 * train_s) for _ in range(n))
        r = run(args, args.max_restarts, kill_at)
        ok = r["code"] == 0 and r["test_acc"] is not None
        passed += ok
        times = [training_again_after(r, k[0]) for k in r["kills"]]
        back += [t for t in times if t is not None]
        if r["test_acc"] is not None:
            diffs.append(100 * (r["test_acc"] - base["test_acc"]))
        kills = ", ".join(f"{role} {rank} at {t:.1f} s (training again "
                          f"{'-' if b is None else f'{b:.2f} s'})"
                          for (t, role, rank), b in zip(r["kills"], times))
        print(f"trial {trial + 1}: exit {r['code']}, {r['wall_s']:.1f} s, Test_acc "
              f"{r['test_acc']}; killed {kills}", flush=True)
        if not ok:
            sys.stderr.write("\n".join(l for _, l in r["lines"][-30:]) + "\n")
    print(f"{passed} of {args.trials} trials completed with exit 0", flush=True)
    if back:
        back.sort()
        print(f"kill -> training again: median {back[len(back) // 2]:.2f} s, "
              f"max {back[-1]:.2f} s over {len(back)} kills")
    if diffs:
        print(f"Test_acc against undisturbed: {min(diffs):+.2f} to {max(diffs):+.2f} points")

    fast_ok = 0
    for trial in range(args.fail_fast):
        r = run(args, 0, [args.rng.uniform(0.2, 0.8 * train_s)])
        if not r["kills"]:
            continue
        kill_s, role, rank = r["kills"][0]
        named = next((l for t, l in r["lines"] if t >= kill_s and f"{role} {rank}" in l
                      and ("fail" in l or "lost" in l)), None)
        took = r["wall_s"] - kill_s
        ok = r["code"] != 0 and named is not None and took < 1.0
        fast_ok += ok
        print(f"--max-restarts 0, {role} {rank} killed: exit {r['code']} {took:.2f} s after the "
              f"kill; {named}", flush=True)
    print(f"{fast_ok} of {args.fail_fast} fail-fast trials exited non-zero within 1 s, naming "
          f"the lost member")
    return 0 if passed == args.trials and fast_ok == args.fail_fast else 1


if __name__ == "__main__":
    sys.exit(main())
