#!/usr/bin/env python3
"""What losing and regaining a worker costs an elastic allreduce job (Horovod's elastic mode).

Runs examples/python/horovod_elastic_mnist.py (LeNet, Fashion-MNIST, fixed seed) under
`dtrain launch -s 0 --host-discovery-script --min-np 2 --max-np 3` twice: undisturbed on 3 slots,
and with the youngest worker killed (SIGKILL) KILL_AFTER seconds in, then one more slot offered
by the discovery script ADD_AFTER seconds after the kill (a new worker joins at the next commit).
Prints each run's final Test_acc and wall time, and for the disturbed run the time from the kill
to the survivors' new membership (the launcher's "membership 2" line) and to rank 0's "Reset"
line (training again), and from the new slot to the membership of 3.

With --ssh-hosts, the same across 3 emulated hosts (network namespaces with their own sshd, the
launcher tests' cluster: build/tests/programs/ssh_test_cluster; needs root) under --launcher ssh,
one slot each: the killed worker is host 3's (killed there), the discovery script then drops that
host and ADD_AFTER seconds later offers it again (its retired slot counts afresh: a new worker
starts there).

With --cpp, the job is the C++ front end instead: dtrain-train (LeNet, Fashion-MNIST, the
horovod kvstore) through train::RunElastic, committing every 50 steps; its "training again" is
rank 0's first line of the new membership ("worker 0 of 2 (elastic ...").

    python3 bench/elastic_bench.py [--epochs 2] [--kill-after 10] [--add-after 8] [--ssh-hosts]
                                   [--cpp]
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

from emulated_hosts import emulated_hosts

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def netns_pids(netns: str, needle: str) -> list[int]:
    """The processes in `netns` whose command line holds `needle`."""
    out = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True,
                         timeout=10).stdout.split()
    found = []
    for pid in out:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if needle.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


def write_hosts(path: str, cluster: dict | None, slots: int) -> None:
    """`slots` slots: on this machine, or one on each of the first `slots` emulated hosts."""
    with open(path, "w") as f:
        if cluster is None:
            f.write(f"localhost:{slots}\n")
        else:
            f.write("".join(f"{h}:1\n" for h in cluster["hosts"][:slots]))


def run(args: argparse.Namespace, disturb: bool, cluster: dict | None) -> dict:
    tmp = tempfile.mkdtemp(prefix="dtrain-elastic-bench-")
    hosts = os.path.join(tmp, "hosts")
    write_hosts(hosts, cluster, 3)
    example = os.path.join(REPO, "examples", "python", "horovod_elastic_mnist.py")
    python_path = os.pathsep.join(
        [os.path.join(args.build, "python"), os.path.join(REPO, "examples", "python")])
    over_ssh = [] if cluster is None else [
        "--launcher", "ssh", "--ssh-opts", cluster["ssh_opts"], "--env", f"PYTHONPATH:{python_path}",
        "--env", "PYTHONUNBUFFERED:1"]
    program = ([args.train, "--log-interval", "0"] if args.cpp
               else [sys.executable, example])
    argv = [args.dtrain, "launch", *over_ssh, "-s", "0", "--host-discovery-script",
            f"cat {hosts}", "--min-np", "2", "--max-np", "3", "--", *program,
            "--epochs", str(args.epochs)]
    env = dict(os.environ, PYTHONPATH=python_path, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    start = time.time()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    lines: list[tuple[float, str]] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append((time.time(), line.rstrip("\n")))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    result: dict = {}
    try:
        if disturb and cluster is None:
            time.sleep(args.kill_after)
            workers = children(proc.pid)
            victim = max(workers)  # the youngest: never rank 0, the oldest
            result["killed_at"] = time.time()
            os.kill(victim, signal.SIGKILL)
            time.sleep(args.add_after)
            write_hosts(hosts, cluster, 4)
            result["added_at"] = time.time()
        elif disturb:
            time.sleep(args.kill_after)
            # Host 3's processes of the job (its worker, never rank 0: the oldest is host 1's).
            victims = netns_pids(cluster["netns"][2],
                                 "dtrain-train" if args.cpp else "horovod_elastic_mnist.py")
            result["killed_at"] = time.time()
            for pid in victims:
                os.kill(pid, signal.SIGKILL)
            write_hosts(hosts, cluster, 2)  # the host is gone...
            time.sleep(args.add_after)
            write_hosts(hosts, cluster, 3)  # ...and back
            result["added_at"] = time.time()
        code = proc.wait(timeout=args.timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    reader.join(5)
    result["code"] = code
    result["wall_s"] = time.time() - start
    accs = [float(m.group(1)) for _, line in lines
            if (m := re.search(r"Epoch \d+: Test_acc ([0-9.]+)", line))]
    result["test_acc"] = accs[-1] if accs else None

    def first_after(t: float, pattern: str) -> float | None:
        for when, line in lines:
            if when >= t and re.search(pattern, line):
                return when - t
        return None

    if disturb:
        k, a = result["killed_at"], result["added_at"]
        result["to_membership_s"] = first_after(k, r"membership 2: 2 rank")
        result["to_training_s"] = first_after(
            k, r"worker 0 of 2 \(elastic" if args.cpp else r"Reset: 2 rank")
        result["add_to_membership_s"] = first_after(a, r"membership 3: 3 rank")
    if code != 0:
        print("\n".join(line for _, line in lines[-40:]), file=sys.stderr)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--kill-after", type=float, default=10.0)
    ap.add_argument("--add-after", type=float, default=8.0)
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--dtrain", default=None)
    ap.add_argument("--ssh-hosts", action="store_true",
                    help="across 3 emulated hosts over ssh (needs root)")
    ap.add_argument("--cpp", action="store_true",
                    help="the C++ front end (dtrain-train) instead of the Python example")
    args = ap.parse_args()
    args.dtrain = args.dtrain or os.path.join(args.build, "src", "tools", "dtrain")
    args.train = os.path.join(args.build, "src", "train", "dtrain-train")
    if args.ssh_hosts:
        with emulated_hosts(os.path.join(args.build, "tests", "programs", "ssh_test_cluster"),
                            3) as cluster:
            compare(args, cluster)
    else:
        compare(args, None)


def compare(args: argparse.Namespace, cluster: dict | None) -> None:
    plain = run(args, disturb=False, cluster=cluster)
    print("undisturbed: exit %s, %.1f s, Test_acc %s" % (plain["code"], plain["wall_s"],
                                                          plain["test_acc"]), flush=True)
    hit = run(args, disturb=True, cluster=cluster)
    print("killed + added: exit %s, %.1f s, Test_acc %s; kill -> membership of 2 %.2f s, "
          "-> training again %.2f s; new slot -> membership of 3 %.2f s"
          % (hit["code"], hit["wall_s"], hit["test_acc"], hit["to_membership_s"] or -1,
             hit["to_training_s"] or -1, hit["add_to_membership_s"] or -1), flush=True)
    if plain["test_acc"] is not None and hit["test_acc"] is not None:
        print("Test_acc difference: %.2f points" % (100 * (hit["test_acc"] - plain["test_acc"])))


if __name__ == "__main__":
    main()
