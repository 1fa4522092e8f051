"""Horovod's elastic mode (dtrain.torch.elastic, `dtrain launch --host-discovery-script`), as a
user runs it: a real launcher, real worker processes, a worker killed with SIGKILL mid-epoch and
one added when the discovery script offers a new slot."""

import glob
import json
import os
import re
import signal
import time

import pytest

from conftest import DTRAIN, TRAIN, job_env, program
from test_observability import fetch_json, render, status_url


def events(log_dir):
    out = []
    for path in glob.glob(os.path.join(log_dir, "events-*.jsonl")):
        with open(path) as f:
            for line in f:
                if line.endswith("\n"):
                    out.append(json.loads(line))
    return sorted(out, key=lambda e: e["t"])


def wait_for(what, predicate, launcher, timeout=90):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        if launcher.proc.poll() is not None:
            pytest.fail("the job ended (exit %s) before %s:\n%s"
                        % (launcher.proc.returncode, what, launcher.output()))
        time.sleep(0.1)
    pytest.fail("no %s within %s s:\n%s" % (what, timeout, launcher.output()))


def rolled_back_steps(all_events, pid, killed_at):
    """The steps process `pid` took before `killed_at` that it took again after its reset."""
    steps = [e for e in all_events if e["kind"] == "step" and e["pid"] == pid]
    resumed = next(e for e in steps if e["t"] > killed_at)
    return sum(1 for e in steps if e["t"] < killed_at
               and (e["epoch"], e["batch"]) >= (resumed["epoch"], resumed["batch"]))


def offer(hosts, lines):
    """Changes what the host discovery script (`cat hosts`) prints, atomically: a file rewritten
    in place can be read empty in between, which drops every host."""
    staged = hosts.with_name(hosts.name + ".new")
    staged.write_text(lines)
    os.replace(staged, hosts)


def elastic_argv(script, *flags):
    return [DTRAIN, "launch", "-s", "0", "--host-discovery-script", script, *flags, "--",
            *program("elastic_worker.py", 0.03)]


def test_a_commit_holds_every_ranks_samples_so_a_reset_trains_none_again(monkeypatch):
    """ElasticSampler.record_batch marks the batch of every rank's share: the ranks step together,
    so a lost rank's samples up to the commit are done. Restored and synced over 2 ranks, the
    split holds exactly what no rank of 3 had trained (Horovod's kept this rank's samples only,
    and the survivors trained the lost rank's of the epoch again)."""
    import torch

    from dtrain.torch import elastic

    membership = {"rank": 0, "size": 3}
    monkeypatch.setattr(elastic.ops, "is_initialized", lambda: True)
    monkeypatch.setattr(elastic.ops, "rank", lambda: membership["rank"])
    monkeypatch.setattr(elastic.ops, "size", lambda: membership["size"])
    dataset = torch.utils.data.TensorDataset(torch.arange(90))
    samplers = [elastic.ElasticSampler(dataset, shuffle=True, seed=5) for _ in range(3)]
    for r, sampler in enumerate(samplers):
        membership["rank"] = r
        sampler.reset()
    shares = [list(sampler) for sampler in samplers]
    for sampler in samplers:
        for batch in range(4):
            sampler.record_batch(batch, 5)
    trained = {i for share in shares for i in share[:20]}
    committed = [sampler.state_dict() for sampler in samplers]
    assert all(set(c["processed_indices"]) == trained for c in committed)

    # Rank 2 is lost; the survivors restore the commit and split the rest over 2 ranks.
    membership["size"] = 2
    rest = []
    for r in range(2):
        membership["rank"] = r
        samplers[r].load_state_dict(committed[r])
        rest += list(samplers[r])
    assert set(rest) == set(range(90)) - trained
    assert len(rest) == 30  # 90 - 3 x 20, split evenly: nothing twice


def test_a_killed_worker_leaves_the_others_training_and_a_new_slot_adds_one(spawn, tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:3\n")
    log_dir = str(tmp_path)
    launcher = spawn(elastic_argv("cat %s" % hosts, "--min-np", "2", "--max-np", "3",
                                  "--elastic-timeout", "60", "--status-port", "0"),
                     job_env({"ELASTIC_LOG_DIR": log_dir,
                              "DTRAIN_TIMELINE": str(tmp_path / "job.json")}))
    url = status_url(launcher)

    def steps_of_size(n, after=0.0):
        return [e for e in events(log_dir) if e["kind"] == "step" and e["size"] == n
                and e["t"] > after]

    def at_least(count, n, after=0.0):
        found = steps_of_size(n, after)
        return found if len(found) >= count else None

    first = wait_for("3 ranks training", lambda: at_least(30, 3), launcher)
    victim = max(e["pid"] for e in first if e["rank"] != 0)
    killed_at = time.time()
    os.kill(victim, signal.SIGKILL)

    after_kill = wait_for("2 ranks training after the kill",
                          lambda: at_least(10, 2, killed_at), launcher)
    assert victim not in {e["pid"] for e in after_kill}
    # The survivors synced after their reset (a failure: their states may differ).
    assert any(e["kind"] == "sync" and e["size"] == 2 and e["pid"] == after_kill[0]["pid"]
               for e in events(log_dir)), after_kill[0]
    # They went back to their last commit (every 4 batches, and at each epoch's end): the first
    # step of 2 ranks follows a committed batch count.
    assert (after_kill[0]["batch"] - 1) % 4 == 0, after_kill[0]
    offer(hosts, "localhost:4\n")  # one more slot: a new worker
    added_at = time.time()
    again = wait_for("3 ranks training again",
                     lambda: at_least(120, 3, added_at), launcher)
    pids = {e["pid"] for e in again}
    assert victim not in pids and len(pids) == 3

    # The status page lists every membership and the retired slot, in order.
    resets = fetch_json(url)["resets"]
    what = [r.split(": ", 1)[1].split(":")[0] for r in resets]
    assert what[0] == "membership 1" and what[2:] == ["membership 2", "membership 3"], resets
    assert re.fullmatch(r"worker \d \(pid %d\) was killed by signal 9 \(SIGKILL\)" % victim,
                        what[1]), resets
    dom, _ = render(url, tmp_path)
    assert "membership 3: 3 rank(s)" in dom, dom

    (tmp_path / "stop").write_text("")
    code = launcher.wait(120)
    out = launcher.output()
    assert code == 0, out
    finals = [e for e in events(log_dir) if e["kind"] == "final"]
    assert len(finals) == 3, out
    # The newcomer got rank 0's weights (sync) and every step since was averaged over all:
    # every rank ends with the same weights, close to the truth.
    assert all(f["weights"] == finals[0]["weights"] for f in finals), finals
    for got, want in zip(finals[0]["weights"], [1.0, -2.0, 3.0, 0.5]):
        assert abs(got - want) < 0.1, finals[0]
    assert "the job's cause" not in out, out  # the failure was recovered from
    # The merged timeline marks every membership and the retired slot on the launcher's row.
    with open(tmp_path / "job.json") as f:
        trace = json.load(f)["traceEvents"]
    launcher_row = [e["pid"] for e in trace if e.get("name") == "process_name"
                    and e["args"]["name"] == "dtrain launch"]
    assert len(launcher_row) == 1, trace[:20]
    marks = [e["name"] for e in trace if e.get("ph") == "i" and e["pid"] == launcher_row[0]]
    assert [m.split(":")[0] for m in marks] == [w.split(":")[0] for w in what], (marks, what)
    assert "its slot on localhost is retired" in out, out
    assert "membership" in out, out
    # The new membership's line says how many steps the survivors redo: the most either took,
    # before the kill, from the step it resumed at (its first after the reset).
    redone = max(rolled_back_steps(events(log_dir), pid, killed_at)
                 for pid in {e["pid"] for e in after_kill})
    said = re.search(r"membership 2: 2 rank\(s\): [^;\n]*(?:; rolled back (\d+) step\(s\))?",
                     out)
    assert said and int(said.group(1) or 0) == redone, (redone, out)


def test_a_job_below_min_np_fails_after_the_elastic_timeout(spawn, tmp_path):
    launcher = spawn(elastic_argv("echo localhost:1", "--min-np", "2", "--max-np", "2",
                                  "--elastic-timeout", "3"),
                     job_env({"ELASTIC_LOG_DIR": str(tmp_path)}))
    code = launcher.wait(60)
    out = launcher.output()
    assert code != 0, out
    assert "fewer than --min-np 2" in out and "--elastic-timeout" in out, out


def test_a_failing_discovery_script_is_named(spawn, tmp_path):
    launcher = spawn(elastic_argv("echo oops >&2; exit 3", "--min-np", "1",
                                  "--elastic-timeout", "2"),
                     job_env({"ELASTIC_LOG_DIR": str(tmp_path)}))
    code = launcher.wait(60)
    out = launcher.output()
    assert code != 0, out
    assert "the host discovery script failed (exit code 3)" in out, out


def test_a_host_the_script_drops_has_its_worker_leave_with_exit_code_0(spawn, tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:1\n127.0.0.1:1\n")  # two names of this machine: two hosts
    log_dir = str(tmp_path)
    launcher = spawn(elastic_argv("cat %s" % hosts, "--min-np", "1", "--max-np", "2",
                                  "--elastic-timeout", "60"),
                     job_env({"ELASTIC_LOG_DIR": log_dir}))

    def steps(size):
        found = [e for e in events(log_dir) if e["kind"] == "step" and e["size"] == size]
        return found if len(found) >= 20 else None

    wait_for("2 ranks training", lambda: steps(2), launcher)
    offer(hosts, "localhost:1\n")
    wait_for("1 rank training after the drop", lambda: steps(1), launcher)
    (tmp_path / "stop").write_text("")
    code = launcher.wait(120)
    out = launcher.output()
    assert code == 0, out
    assert "the host discovery script dropped 127.0.0.1" in out, out
    assert "removed this worker from the elastic job" in out, out
    assert "worker 1 on 127.0.0.1: exited with code 0" in out, out
    finals = [e for e in events(log_dir) if e["kind"] == "final"]
    assert len(finals) == 1 and finals[0]["size"] == 1, finals
    # A worker only left: the one left reset to a membership of 1 and trained on without a
    # sync (Horovod's skip_sync); after a kill or an addition every rank syncs.
    mine = [e for e in events(log_dir) if e["worker"] == 0]
    reset = next(i for i, e in enumerate(mine) if e["kind"] == "reset" and e["size"] == 1)
    next_step = next(i for i, e in enumerate(mine) if i > reset and e["kind"] == "step")
    assert not any(e["kind"] == "sync" for e in mine[reset:next_step]), mine[reset:next_step + 1]


def test_the_cpp_trainer_survives_a_killed_worker_and_takes_in_a_new_one(spawn, tmp_path):
    """dtrain-train (the C++ Trainer through train::RunElastic and its horovod kvstore): a rank
    SIGKILLed between commits, the survivors go back to their last commit on 2 ranks; a fourth
    slot brings 3 ranks again, the newcomer synced from rank 0; every rank ends with the same
    weights."""
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:3\n")
    launcher = spawn([DTRAIN, "launch", "-s", "0", "--host-discovery-script", "cat %s" % hosts,
                      "--min-np", "2", "--max-np", "3", "--elastic-timeout", "60", "--",
                      TRAIN, "--epochs", "4", "--limit-train", "24000", "--log-interval", "25",
                      "--commit-every", "40", "--threads", "1"], job_env())

    def said(pattern, after=0):
        found = re.findall(pattern, launcher.output()[after:])
        return found or None

    first = wait_for("3 ranks training", lambda: said(
        r"\[worker 2\] Epoch\[\d\] Batch \[\d+-\d+\]"), launcher)
    assert first
    victim = int(said(r"worker 2 of 3 \(elastic, pid (\d+)\)")[0])
    mark = len(launcher.output())
    os.kill(victim, signal.SIGKILL)
    wait_for("2 ranks training after the kill", lambda: said(
        r"worker 0 of 2 \(elastic, pid \d+\).*from epoch (\d+), sample (\d+) of 24000, "
        r"step (\d+)", mark), launcher)
    # Rolled back to a commit: every 40 steps, or an epoch's end (sample 0).
    epoch, sample, step = (int(x) for x in said(
        r"worker 0 of 2 \(elastic, pid \d+\).*from epoch (\d+), sample (\d+) of 24000, "
        r"step (\d+)", mark)[0])
    assert int(step) % 40 == 0 or sample == 0, (epoch, sample, step)
    offer(hosts, "localhost:4\n")
    wait_for("3 ranks again", lambda: said(r"membership 3: 3 rank\(s\)", mark), launcher)
    code = launcher.wait(180)
    out = launcher.output()
    assert code == 0, out
    # The trainer of the failed membership finished every bucket's exchange before it went (a
    # failed one left its lock unlocked, and the next bucket's "Operation not permitted" skipped
    # the wait for its exchange).
    assert "Operation not permitted" not in out, out
    newcomer = re.search(r"\[worker 3\] worker (\d) of 3 \(elastic, pid \d+\).*from epoch (\d+), "
                         r"sample (\d+)", out)
    assert newcomer, out  # joined where the others were, not at the start
    assert (int(newcomer.group(2)), int(newcomer.group(3))) > (0, 0), newcomer.group(0)
    finals = re.findall(r"worker \d of (\d): trained (\d+) step\(s\); sum of the weights (\S+)",
                        out)
    assert len(finals) == 3 and len({f for f in finals}) == 1, finals
    assert finals[0][0] == "3", finals
    accs = re.findall(r"Epoch 3: Test_acc ([0-9.]+)", out)
    assert len(set(accs)) == 1 and float(accs[0]) > 0.8, accs
    assert re.search(r"membership 2: 2 rank\(s\): worker 0, worker 1", out), out
    assert "the job's cause" not in out, out
