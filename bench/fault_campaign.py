#!/usr/bin/env python3
"""A campaign of faults in bursts against dtrain jobs that promise to survive them (issue 63):
each trial runs the main job (LeNet on Fashion-MNIST, 1 epoch, fixed seed) in one mode, with or
without two CPU hogs beside it, and deals it 1 to 3 faults at random times after its first
progress line, 0.1 to 10 s apart (log-uniform). The modes:
- dist_sync, dist_async: 2 workers, 2 servers, `dtrain launch --max-restarts 2` on this machine;
  faults: kill -9 of a worker, a server or the scheduler, or SIGSTOP of any of them for 0.5 to
  8 s, then SIGCONT;
- elastic: Horovod's elastic API (examples/python/horovod_elastic_mnist.py, hvd.elastic) on 3
  slots, `--min-np 2 --elastic-timeout 5`; faults: kill -9 or SIGSTOP of a worker;
- link_cut: dist_sync across 4 emulated hosts (network namespaces with their own sshd, one member
  on each; the scheduler on this machine; needs root) under `--launcher ssh --max-restarts 2`;
  faults: a host's link down for 2 to 30 s, then up, or a kill or stop as in dist_sync.

Each trial records how the job ended (completed / failed / hang: still running HANG_S after the
last fault, then killed), seconds from the last fault to the end and to the next progress line,
the final Test_acc and the first error line. The rules (issue 63):
- covered faults (stops; short cuts; kills of workers and servers, and members lost to a cut, no
  more than --max-restarts; in elastic mode one kill, 3 slots less --min-np): the job completes
  with Test_acc within 0.5 points of an undisturbed run of the same mode and load;
- uncovered (the scheduler killed, more losses than restarts, a kill after the scheduler ended
  the job): every process exits non-zero within 10 s of the loss that was too many, with a line
  naming the member;
- never a hang.

    python3 bench/fault_campaign.py [--trials 40] [--modes dist_sync,dist_async,elastic,link_cut]
                                    [--max-restarts 2] [--seed 1] [--json results.jsonl]
                                    [--logs DIR]   (each trial's whole output, for the failed)
    python3 bench/fault_campaign.py --plan 'kill worker 0@1.7,kill server 0@1.85,stop worker 0
                                    0.5@2.0,cut host 1 20@3' [--modes dist_sync] [--load]
                                    [--repeat 5]
                                    (one trial's faults again: seconds after the first progress
                                    line; the job's output goes to --logs)
"""
import argparse
import contextlib
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)
sys.path.insert(0, BENCH)
from emulated_hosts import emulated_hosts  # noqa: E402  (the bench folder is no package)
from restart_bench import job_members  # noqa: E402

PS_ROLES = [("worker", 0), ("worker", 1), ("server", 0), ("server", 1), ("scheduler", 0)]
ELASTIC_ROLES = [("worker", 0), ("worker", 1), ("worker", 2)]
ELASTIC_SLOTS, ELASTIC_MIN = 3, 2
CUT_HOSTS = 4
TRIAL_SEED = {"elastic": 42}  # the seed trials run with (7: dtrain-train's; the example's 42)
PROGRESS = re.compile(r"Batch \[|Batch \d+:")
HANG_S = 60.0
NAMED_WITHIN_S = 10.0
ACC_POINTS = 0.5


def launch(args: argparse.Namespace, mode: str, cluster: dict | None,
           slots: int = ELASTIC_SLOTS, seed: int = 7) -> subprocess.Popen:
    train = ["--dataset", "fashion-mnist", "--network", "lenet", "--epochs", str(args.epochs),
             "--seed", str(seed), "--log-interval", "50"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    if mode == "elastic":
        with open(args.slots_file, "w") as f:
            f.write(f"localhost:{slots}\n")
        env["PYTHONPATH"] = os.pathsep.join([os.path.abspath(os.path.join(args.build, "python")),
                                             os.path.join(REPO, "examples", "python")])
        argv = [args.dtrain, "launch", "-s", "0", "--host-discovery-script",
                f"cat {args.slots_file}", "--min-np", str(ELASTIC_MIN), "--max-np",
                str(ELASTIC_SLOTS), "--elastic-timeout", "5", "--", sys.executable,
                os.path.join(REPO, "examples", "python", "horovod_elastic_mnist.py"),
                "--epochs", str(args.epochs), "--log-interval", "50", "--seed", str(seed)]
    elif mode == "link_cut":
        assert cluster is not None
        argv = [args.dtrain, "launch", "--launcher", "ssh", "-H", cluster["hostfile"],
                "--ssh-opts", cluster["ssh_opts"], "-n", "2", "-s", "2", "--max-restarts",
                str(args.max_restarts), "--", os.path.abspath(args.train), *train,
                "--kvstore", "dist_sync", "--threads", "1"]  # the hosts share these cores
    else:
        argv = [args.dtrain, "launch", "-n", "2", "-s", "2", "--launcher", "local",
                "--max-restarts", str(args.max_restarts), "--", args.train, *train,
                "--kvstore", mode]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env=env)


def plan_faults(rng: random.Random, mode: str) -> list[dict]:
    roles = ELASTIC_ROLES if mode == "elastic" else PS_ROLES
    faults, at = [], rng.uniform(0.5, 6.0)
    for i in range(rng.randint(1, 3)):
        if i:
            at += math.exp(rng.uniform(math.log(0.1), math.log(10.0)))
        if mode == "link_cut" and rng.random() < 0.5:
            faults.append({"at": at, "kind": "cut", "role": "host", "rank": rng.randrange(CUT_HOSTS),
                           "stop_s": rng.uniform(2.0, 30.0)})
            continue
        role, rank = rng.choice(roles)
        kind = rng.choice(["kill", "kill", "stop"])
        faults.append({"at": at, "kind": kind, "role": role, "rank": rank,
                       "stop_s": rng.uniform(0.5, 8.0) if kind == "stop" else 0.0})
    return faults


def set_link(cluster: dict, host: int, state: str) -> None:
    subprocess.run(["ip", "-n", cluster["netns"][host], "link", "set", cluster["interface"],
                    state], check=True, timeout=10)


def run(args: argparse.Namespace, mode: str, load: bool, faults: list[dict],
        cluster: dict | None = None, slots: int = ELASTIC_SLOTS, seed: int = 7) -> dict:
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)] \
        if load else []
    start = time.monotonic()
    proc = launch(args, mode, cluster, slots, seed)
    # Over ssh the members are sshd's children, not in the launcher's session (one job at a time).
    session = None if mode == "link_cut" else proc.pid
    lines: list[tuple[float, str]] = []
    done: list[dict] = []
    last_fault = [None]

    def dealer() -> None:
        while not any(PROGRESS.search(l) for _, l in lines):
            if proc.poll() is not None:
                return
            time.sleep(0.02)
        t0 = time.monotonic()
        for f in faults:
            while time.monotonic() - t0 < f["at"]:
                if proc.poll() is not None:
                    return
                time.sleep(0.01)
            if f["kind"] == "cut":
                assert cluster is not None
                set_link(cluster, f["rank"], "down")
                done.append(dict(f, t=time.monotonic() - start))
                last_fault[0] = time.monotonic() - start
                time.sleep(f["stop_s"])
                set_link(cluster, f["rank"], "up")
                last_fault[0] = time.monotonic() - start
                continue
            pid, alive = None, {}
            for _ in range(300):  # a member being replaced has no process yet: wait for it
                alive = job_members(session)
                pid = alive.get((f["role"], f["rank"]))
                if pid is not None or proc.poll() is not None:
                    break
                time.sleep(0.01)
            if pid is None:
                continue
            # After the scheduler ended the job (it exits once every worker finished) no
            # replacement can join: the fault is not one that restarts cover.
            f = dict(f, after_end=mode != "elastic" and ("scheduler", 0) not in alive)
            t = time.monotonic() - start
            try:
                os.kill(pid, signal.SIGKILL if f["kind"] == "kill" else signal.SIGSTOP)
            except ProcessLookupError:
                continue
            done.append(dict(f, t=t))
            last_fault[0] = t
            if f["kind"] == "stop":
                time.sleep(f["stop_s"])
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
                last_fault[0] = time.monotonic() - start

    def watchdog() -> None:  # a hang: HANG_S after the last fault (or 600 s in all)
        while proc.poll() is None:
            now = time.monotonic() - start
            if (last_fault[0] is not None and now - last_fault[0] > HANG_S) or now > 600:
                result["hang"] = True
                os.killpg(proc.pid, signal.SIGKILL)
                return
            time.sleep(0.2)

    result: dict = {"hang": False}
    threading.Thread(target=dealer, daemon=True).start()
    threading.Thread(target=watchdog, daemon=True).start()
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            lines.append((time.monotonic() - start, line.rstrip("\n")))
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for h in hogs:
            h.kill()
            h.wait()
        if cluster is not None:
            for h in range(CUT_HOSTS):  # a cut that the job's end interrupted
                set_link(cluster, h, "up")
        for pid in job_members(session).values():  # anything left of the job
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    end = time.monotonic() - start
    acc = None
    for _, l in lines:
        # Rank 0's, or in an elastic job whoever's is rank 0 now (the output names the first).
        m = re.match(rf"\[worker \d+\] Epoch {args.epochs - 1}: Test_acc ([0-9.]+)", l)
        if m:
            acc = float(m.group(1))
    result.update(code=code, lines=lines, faults=done, test_acc=acc, end_s=end)
    return result


def training_again(r: dict, since: float) -> float | None:
    for t, l in r["lines"]:
        if t > since and PROGRESS.search(l):
            return t - since
    return None


def first_error(r: dict) -> str:
    """The first error line of the job (else the first warning of a loss)."""
    for pattern in (r" ERROR |error:", r"fail|lost|cannot|did not"):
        for _, l in r["lines"]:
            if re.search(pattern, l) and "exited with code 0" not in l:
                return l.strip()[:300]
    return ""


def losses(r: dict, mode: str) -> list[tuple[float, str]]:
    """The job's members lost, in time order: (seconds, what): kills, and in the parameter-server
    modes the members the scheduler lost to their silence (a cut link, a long stop), which the
    launcher then kills to replace them."""
    out = [(f["t"], f"{f['role']} {f['rank']}") for f in r["faults"] if f["kind"] == "kill"]
    if mode != "elastic":
        for t, l in r["lines"]:
            m = re.search(r"dtrain launch: the scheduler lost ((worker|server) \d+)", l)
            if m:
                out.append((t, m.group(1)))
    return sorted(out)


def judge(r: dict, args: argparse.Namespace, mode: str,
          base_acc: list[float]) -> tuple[str, bool, str]:
    """(outcome, the rules met, why not)."""
    kills = [f for f in r["faults"] if f["kind"] == "kill"]
    scheduler_killed = any(f["role"] == "scheduler" for f in kills)
    # The scheduler may exit between the check above and the kill: the launcher says so.
    ended = " ".join(l for _, l in r["lines"] if "after the scheduler had ended the job" in l)
    after_end = [f for f in kills if f.get("after_end") or (
        f["role"] != "scheduler" and f"{f['role']} {f['rank']} (pid" in ended)]
    lost = losses(r, mode)
    budget = ELASTIC_SLOTS - ELASTIC_MIN if mode == "elastic" else args.max_restarts
    covered = not scheduler_killed and not after_end and len(lost) <= budget
    outcome = "hang" if r["hang"] else ("completed" if r["code"] == 0 and r["test_acc"] is not None
                                        else "failed")
    if outcome == "hang":
        return outcome, False, "no end within %.0f s of the last fault" % HANG_S
    if covered:
        if outcome != "completed":
            return outcome, False, "covered faults, but the job failed"
        low, high = min(base_acc) - ACC_POINTS / 100, max(base_acc) + ACC_POINTS / 100
        if not low <= r["test_acc"] <= high:
            return outcome, False, "Test_acc %.4f against %s undisturbed" % (
                r["test_acc"], "-".join("%.4f" % a for a in sorted(set(base_acc))))
        return outcome, True, ""
    if outcome == "completed":  # e.g. a kill of a member that had already finished its part
        return outcome, True, ""
    # Uncovered: the end within NAMED_WITHIN_S of the loss that could not be covered.
    first_fatal = [f["t"] for f in kills if f["role"] == "scheduler" or f in after_end]
    fatal = min(first_fatal) if first_fatal else lost[budget][0]
    took = r["end_s"] - fatal
    named = re.search(r"(worker|server) \d|scheduler", first_error(r) + " ".join(
        l for t, l in r["lines"] if t >= fatal))
    if took > NAMED_WITHIN_S:
        return outcome, False, "ended %.1f s after the uncovered fault" % took
    if not named:
        return outcome, False, "no line names the member"
    return outcome, True, ""


def describe(faults: list[dict]) -> str:
    return ", ".join(
        f"{f['kind']} {f['role']}{'' if f['role'] == 'scheduler' else ' %d' % f['rank']}"
        f"{' %.1f s' % f['stop_s'] if f['kind'] in ('stop', 'cut') else ''} at {f['t']:.1f}"
        for f in faults)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=40)
    p.add_argument("--modes", default="dist_sync,dist_async,elastic,link_cut")
    p.add_argument("--max-restarts", type=int, default=2)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--build", default="build")
    p.add_argument("--json", help="append one JSON line per trial to this file")
    p.add_argument("--logs", help="write the output of each trial that broke a rule here")
    p.add_argument("--plan", help="these faults instead of random ones (see above)")
    p.add_argument("--load", action="store_true", help="with --plan: two CPU hogs beside")
    p.add_argument("--repeat", type=int, default=1, help="with --plan: how many times")
    args = p.parse_args()
    args.dtrain = os.path.join(args.build, "src", "tools", "dtrain")
    args.train = os.path.join(args.build, "src", "train", "dtrain-train")
    scratch = tempfile.mkdtemp(prefix="dtrain-fault-campaign-")
    args.slots_file = os.path.join(scratch, "slots")
    modes = args.modes.split(",")
    if args.logs:
        os.makedirs(args.logs, exist_ok=True)
    with contextlib.ExitStack() as stack:
        cluster = None
        if "link_cut" in modes:
            cluster = dict(stack.enter_context(emulated_hosts(
                os.path.join(args.build, "tests", "programs", "ssh_test_cluster"), CUT_HOSTS)))
            cluster["hostfile"] = os.path.join(scratch, "hosts")
            with open(cluster["hostfile"], "w") as f:
                f.write("".join(h + "\n" for h in cluster["hosts"]))
        return replay(args, modes[0], cluster) if args.plan else campaign(args, modes, cluster)


def replay(args: argparse.Namespace, mode: str, cluster: dict | None) -> int:
    plan = []
    for item in args.plan.split(","):
        what, at = item.rsplit("@", 1)
        words = what.split()
        plan.append({"at": float(at), "kind": words[0], "role": words[1],
                     "rank": int(words[2]) if words[1] != "scheduler" else 0,
                     "stop_s": float(words[-1]) if words[0] in ("stop", "cut") else 0.0})
    bad = 0
    for i in range(args.repeat):
        r = run(args, mode, args.load, plan, cluster, seed=TRIAL_SEED.get(mode, 7))
        outcome = "hang" if r["hang"] else ("completed" if r["code"] == 0 else "failed")
        bad += outcome != "completed"
        print(f"run {i + 1}: {outcome} (exit {r['code']}), {r['end_s']:.1f} s, Test_acc "
              f"{r['test_acc']}; {first_error(r)}", flush=True)
        if args.logs:
            with open(os.path.join(args.logs, f"plan-{i + 1}.log"), "w") as f:
                f.write("\n".join(f"{t:8.3f} {l}" for t, l in r["lines"]) + "\n")
    return 1 if bad else 0


def campaign(args: argparse.Namespace, modes: list[str], cluster: dict | None) -> int:
    rng = random.Random(args.seed)
    # The reference: undisturbed runs. A restart changes the course of training a little (a
    # replacement that resumes in the middle of a step computes the keys its lost process had not
    # pushed from weights that already hold that step's update of the others, docs/reliability.md),
    # and one epoch of LeNet then ends as a run with another seed does: dist_sync's reference is
    # runs with the trials' seed and two others. dist_async's order of updates varies from run to
    # run: five runs with the trials' seed. An elastic job that loses a worker trains on with
    # fewer ranks (a smaller global batch, its learning rate scaled down): runs on every
    # membership it may have, 3 slots and --min-np, with its trials' seed (42) and two others.
    runs = {"dist_sync": [(0, 7), (0, 8), (0, 9)], "link_cut": [(0, 7), (0, 8), (0, 9)],
            "dist_async": [(0, 7)] * 5,
            "elastic": [(slots, seed) for seed in (42, 43, 44)
                        for slots in (ELASTIC_SLOTS, ELASTIC_MIN)]}
    base: dict[tuple[str, bool], list[float]] = {}
    for mode in modes:
        for load in (False, True):
            for slots, seed in runs[mode]:
                r = run(args, mode, load, [], cluster, slots or ELASTIC_SLOTS, seed)
                if r["code"] != 0 or r["test_acc"] is None:
                    sys.stderr.write("\n".join(l for _, l in r["lines"][-30:]) + "\n")
                    return 1
                base.setdefault((mode, load), []).append(r["test_acc"])
                print(f"undisturbed {mode}{' on %d slots' % slots if slots else ''}, seed {seed}"
                      f"{' under load' if load else ''}: {r['end_s']:.1f} s, "
                      f"Test_acc {r['test_acc']}", flush=True)

    met, outcomes, slowest = 0, {}, 0.0
    for trial in range(args.trials):
        mode, load = rng.choice(modes), rng.random() < 0.5
        r = run(args, mode, load, plan_faults(rng, mode), cluster, seed=TRIAL_SEED.get(mode, 7))
        outcome, ok, why = judge(r, args, mode, base[(mode, load)])
        met += ok
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        last = max((f["t"] + (f["stop_s"] if f["kind"] in ("stop", "cut") else 0.0)
                    for f in r["faults"]), default=0.0)
        back = training_again(r, last)
        if outcome == "completed" and back is not None:
            slowest = max(slowest, back)
        print(f"trial {trial + 1} {mode}{' +load' if load else ''}: {outcome} (exit {r['code']}), "
              f"{r['end_s'] - last:.1f} s after the last fault, training again "
              f"{'-' if back is None else '%.1f s' % back}, Test_acc {r['test_acc']}; "
              f"{describe(r['faults']) or 'no fault dealt'}; lost: "
              f"{', '.join(w for _, w in losses(r, mode)) or 'none'}; "
              f"{'OK' if ok else 'RULE BROKEN: ' + why}", flush=True)
        if not ok:
            print("    " + first_error(r), flush=True)
            if args.logs:
                with open(os.path.join(args.logs, f"trial-{trial + 1}.log"), "w") as f:
                    f.write("\n".join(f"{t:8.3f} {l}" for t, l in r["lines"]) + "\n")
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps({"trial": trial + 1, "mode": mode, "load": load,
                                    "outcome": outcome, "rules_met": ok, "why": why,
                                    "code": r["code"], "test_acc": r["test_acc"],
                                    "faults": r["faults"], "lost": losses(r, mode),
                                    "end_after_last_fault_s": r["end_s"] - last,
                                    "training_again_s": back,
                                    "error": first_error(r)}) + "\n")
    print(f"{met} of {args.trials} trials met the rules; outcomes {outcomes}; slowest return to "
          f"training after the last fault of a completed trial {slowest:.1f} s")
    return 0 if met == args.trials else 1


if __name__ == "__main__":
    sys.exit(main())
