#!/usr/bin/env python3
"""What a lost worker or server costs a parameter-server job under `dtrain launch --max-restarts`.

Runs the main job (2 workers, 2 servers, dist_sync LeNet on Fashion-MNIST, fixed seed, model saved
with --save) several times: undisturbed without and with server checkpoints (--max-restarts turns
them on; PAIRS pairs after WARMUP uncounted runs, each pair's order the other way round from the
last's, for the checkpoints' overhead: the median of the pairs' ratios, with a 95% interval for
it, of worker 0's epoch times, of wall times and of the whole job's CPU time; and the share of
the job's CPU that the checkpointed runs' summaries account to checkpoints and push-log copies),
once with worker 1 killed (SIGKILL) KILL_AFTER seconds into its training, and once with server 1
killed. Prints each run's final Test_acc and wall time; for a killed worker the time from the kill
to the replacement's "resuming at step" line and to its first progress line (training again); for
a killed server the time to its restore and to the next progress line, and whether the saved
model (weights and the servers' optimizer state) equals the undisturbed run's exactly (the
checkpoint + replay path is exact on dist_sync).

With --ssh-hosts, the same across 3 emulated hosts (network namespaces with their own sshd, the
launcher tests' cluster: build/tests/programs/ssh_test_cluster; needs root) under --launcher ssh
with a hostfile: the killed worker or server is replaced on its host over ssh.

    python3 bench/restart_bench.py [--epochs 2] [--kill-after 8] [--dtrain build/src/tools/dtrain]
                                   [--pairs 5] [--warmup 1] [--overhead-only] [--ssh-hosts]
"""
import argparse
import math
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time

from emulated_hosts import emulated_hosts


def job_members(session: int | None = None) -> dict[tuple[str, int], int]:
    """The live processes of a dtrain job by (role, rank): its workers (dtrain-train) and its
    servers and scheduler (`dtrain server`, `dtrain scheduler`), by DMLC_ROLE and DTRAIN_NODE_RANK
    (the scheduler is rank 0). With `session`, only that session's (a launcher started with
    start_new_session: its pid), whatever their program (a Python worker too)."""
    found = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read().rsplit(")", 1)[1].split()  # state, ppid, pgrp, session, ...
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
        except (OSError, ValueError, IndexError):
            continue
        if stat[0] == "Z" or (session is not None and int(stat[3]) != session):
            continue
        if session is None and not (
                cmd[0].endswith(b"dtrain-train") or
                (cmd[0].endswith(b"dtrain") and cmd[1:2] in ([b"server"], [b"scheduler"]))):
            continue
        role = env.get(b"DMLC_ROLE", b"").decode()
        if role in ("worker", "server", "scheduler"):
            found[(role, int(env.get(b"DTRAIN_NODE_RANK", b"0") or 0))] = int(pid)
    return found


def member_pid(role: str, rank: int) -> int | None:
    """The pid of the job's `role` `rank` (any job's on this machine), or None."""
    return job_members().get((role, rank))


def same_weights(a: str, b: str) -> bool:
    """Whether two models saved by dtrain-train --save hold identical tensors (the files
    themselves may differ in archive details)."""
    import torch  # Debian's python3-torch reads LibTorch's archives
    x, y = torch.jit.load(a), torch.jit.load(b)
    tx = dict(list(x.named_parameters()) + list(x.named_buffers()))
    ty = dict(list(y.named_parameters()) + list(y.named_buffers()))
    return tx.keys() == ty.keys() and all(torch.equal(tx[k], ty[k]) for k in tx)


def run(args: argparse.Namespace, kill: str | None, restarts: bool, save: str) -> dict:
    """kill: None, "worker" or "server" (rank 1 of that role is killed)."""
    argv = [args.dtrain, "launch", "-n", "2", "-s", "2", *args.placement]
    if restarts:
        argv += ["--max-restarts", "2"]
    argv += ["--", args.train, "--dataset", "fashion-mnist", "--network", "lenet", "--kvstore",
             "dist_sync", "--epochs", str(args.epochs), "--seed", "7", "--log-interval", "50",
             "--save", save]
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[tuple[float, str]] = []
    killed_at: list[float] = []

    def killer() -> None:
        # KILL_AFTER seconds after worker 1 printed its first progress line.
        while not any("[worker 1] Epoch[0] Batch" in l for _, l in lines):
            if proc.poll() is not None:
                return
            time.sleep(0.05)
        time.sleep(args.kill_after)
        pid = member_pid(kill, 1)
        if pid is not None:
            killed_at.append(time.monotonic() - start)
            os.kill(pid, signal.SIGKILL)

    if kill:
        threading.Thread(target=killer, daemon=True).start()
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append((time.monotonic() - start, line.rstrip("\n")))
    code = proc.wait(timeout=3600)
    # The CPU time of the whole job: the launcher reaps every process it started, so its own
    # children's times are in it. Time another guest of this shared VM takes from us is not.
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = used.ru_utime + used.ru_stime - (cpu_before.ru_utime + cpu_before.ru_stime)
    acc = {}
    epoch_s = 0.0  # worker 0's epochs: the steps, without the processes' start and the tests
    # What the launcher's summary says restarts cost, measured where it is spent (no drift of the
    # machine's pace between runs in it): on the steps, the servers' checkpoints' CPU and the
    # workers' copies into their push logs; at the start, the workers' faulting in of their logs.
    direct_ms = 0.0
    start_ms = 0.0
    for _, l in lines:
        m = re.match(r"\[worker 0\] Epoch\[\d+\] Time cost=([0-9.]+)", l)
        if m:
            epoch_s += float(m.group(1))
        m = re.match(r"\[worker (\d)\] Epoch (\d+): Test_acc ([0-9.]+)", l)
        if m:
            acc[(int(m.group(1)), int(m.group(2)))] = float(m.group(3))
        m = re.search(r"checkpoint\(s\), .* ([0-9.]+) ms of CPU in all", l) or \
            re.search(r"push log: \d+ bytes copied into it in ([0-9.]+) ms", l)
        if m:
            direct_ms += float(m.group(1))
        m = re.search(r"push log: .* faulted in at the start in ([0-9.]+) ms", l)
        if m:
            start_ms += float(m.group(1))
    result = {"code": code, "wall_s": lines[-1][0] if lines else 0.0, "epoch_s": epoch_s,
              "cpu_s": cpu_s, "direct_ms": direct_ms, "start_ms": start_ms,
              "test_acc": acc.get((0, args.epochs - 1))}
    if kill == "worker" and killed_at:
        t0 = killed_at[0]
        after = [(t, l) for t, l in lines if t >= t0 and l.startswith("[worker 1]")]
        resumed = next((t for t, l in after if "replaces a lost worker" in l), None)
        training = next((t for t, l in after if "Batch [" in l and t > (resumed or 1e9)), None)
        result.update({"killed_at_s": t0, "resumed_after_s": resumed and resumed - t0,
                       "training_after_s": training and training - t0,
                       "resume_line": next((l for t, l in after if "replaces" in l), None)})
    if kill == "server" and killed_at:
        t0 = killed_at[0]
        after = [(t, l) for t, l in lines if t >= t0]
        restored = next((t for t, l in after if l.startswith("[server 1]") and " restored " in l),
                        None)
        training = next((t for t, l in after if "Batch [" in l and t > (restored or 1e9)), None)
        result.update({"killed_at_s": t0, "resumed_after_s": restored and restored - t0,
                       "training_after_s": training and training - t0,
                       "resume_line": next((l for t, l in after if " restored " in l), None)})
    if code != 0:
        sys.stderr.write("\n".join(l for _, l in lines[-40:]) + "\n")
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--kill-after", type=float, default=8.0)
    p.add_argument("--pairs", type=int, default=5,
                   help="undisturbed runs without and with checkpoints, alternated")
    p.add_argument("--warmup", type=int, default=1, help="runs first, not counted")
    p.add_argument("--overhead-only", action="store_true", help="no kills")
    p.add_argument("--dtrain", default="build/src/tools/dtrain")
    p.add_argument("--train", default="build/src/train/dtrain-train")
    p.add_argument("--ssh-hosts", action="store_true",
                   help="across 3 emulated hosts over ssh (needs root)")
    p.add_argument("--cluster-helper", default="build/tests/programs/ssh_test_cluster")
    args = p.parse_args()
    args.placement = ["--launcher", "local"]
    if not args.ssh_hosts:
        return compare(args)
    with emulated_hosts(args.cluster_helper, 3) as cluster, \
            tempfile.TemporaryDirectory(prefix="restart-bench-hosts-") as tmp:
        hostfile = os.path.join(tmp, "hosts")
        with open(hostfile, "w") as f:
            f.write("".join(f"{h}\n" for h in cluster["hosts"]))
        args.placement = ["--launcher", "ssh", "-H", hostfile, "--ssh-opts", cluster["ssh_opts"]]
        return compare(args)


def median_with_ci(values: list[float]) -> tuple[float, float, float]:
    """The median of `values` and a distribution-free confidence interval for it of at least
    95% (the order statistics the binomial distribution of the sign test gives; the whole range
    when there are too few values for 95%)."""
    v = sorted(values)
    n = len(v)
    median = v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2
    # The largest k with P(Binomial(n, 1/2) < k) <= 2.5%: [v[k-1], v[n-k]] covers the median
    # with probability at least 95%.
    k, tail = 0, 0.0
    while k < n // 2:
        tail_next = tail + math.comb(n, k) / 2 ** n
        if tail_next > 0.025:
            break
        tail, k = tail_next, k + 1
    lo, hi = (v[k - 1], v[n - k]) if k > 0 else (v[0], v[-1])
    return median, lo, hi


def compare(args: argparse.Namespace) -> int:
    ok = True
    with tempfile.TemporaryDirectory(prefix="restart-bench-") as tmp:
        for _ in range(args.warmup):  # the page cache, the data set's first read: not counted
            r = run(args, None, False, f"{tmp}/warmup.pt")
            print(f"warm-up: exit {r['code']}, {r['wall_s']:.1f} s", flush=True)
        runs = {}
        # Pairs in alternating order (plain first, then checkpointed first, ...), so that a
        # steady drift of the machine's pace favours neither.
        for i in range(args.pairs):
            order = (("plain", False), ("checkpointed", True))
            for name, restarts in order if i % 2 == 0 else order[::-1]:
                r = run(args, None, restarts, f"{tmp}/{name}.pt")
                runs.setdefault(name, []).append(r)
                ok &= r["code"] == 0
                print(f"undisturbed, {name}: exit {r['code']}, {r['wall_s']:.1f} s "
                      f"(worker 0's epochs {r['epoch_s']:.2f} s, "
                      f"the job's CPU {r['cpu_s']:.1f} s), Test_acc {r['test_acc']}", flush=True)
        plain = runs["plain"][0]
        # Each pair's ratio (the machine's pace drifts between pairs), their median, and a 95%
        # interval for that median.
        for what in ("epoch_s", "wall_s", "cpu_s"):
            ratios = [c[what] / p[what] - 1 for p, c in zip(runs["plain"], runs["checkpointed"])]
            median, lo, hi = median_with_ci(ratios)
            print(f"  server checkpoints' overhead ({what}, {len(ratios)} pairs): "
                  f"median {100 * median:+.1f}% "
                  f"(95% interval {100 * lo:+.1f}% to {100 * hi:+.1f}%), "
                  f"pairs " + " ".join(f"{100 * r:+.1f}%" for r in sorted(ratios)), flush=True)
        for key, what in (("direct_ms", "on the steps (checkpoints' CPU + copies into the push "
                                        "logs)"),
                          ("start_ms", "at the start (the push logs faulted in, wall time)")):
            shares = [r[key] / 1000 / r["cpu_s"] for r in runs["checkpointed"]]
            median, lo, hi = median_with_ci(shares)
            print(f"  what the checkpointed runs' summaries account for {what} against the "
                  f"job's CPU: median {100 * median:.2f}% "
                  f"({100 * min(shares):.2f}-{100 * max(shares):.2f}%)", flush=True)
        for victim in () if args.overhead_only else ("worker", "server"):
            hit = run(args, victim, True, f"{tmp}/{victim}.pt")
            ok &= hit["code"] == 0
            print(f"{victim} 1 killed at {hit.get('killed_at_s', 0):.1f} s: exit {hit['code']}, "
                  f"{hit['wall_s']:.1f} s, Test_acc {hit['test_acc']}")
            print(f"  back {hit.get('resumed_after_s')} s after the kill "
                  f"({hit.get('resume_line')}); training again after "
                  f"{hit.get('training_after_s')} s")
            if plain["test_acc"] is not None and hit["test_acc"] is not None:
                print(f"  Test_acc difference: "
                      f"{100 * (hit['test_acc'] - plain['test_acc']):+.2f} points")
            if victim == "server":
                same = same_weights(f"{tmp}/plain.pt", f"{tmp}/server.pt")
                print(f"  final weights and optimizer state equal the undisturbed run's: {same}",
                      flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
