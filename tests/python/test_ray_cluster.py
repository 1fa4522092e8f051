"""dtrain on a Ray cluster of two hosts: two network namespaces (the launcher tests' emulated
hosts, build/tests/programs/ssh_test_cluster), each with its own host name (a UTS namespace, as
real hosts have: dtrain groups local ranks by host name) and its own `ray start` node; the
drivers run on the first host, as a user's script runs on a cluster's head node (a driver outside
the hosts would give the nodes an address of its that they cannot reach, and hang in Ray's object
transfers). RayExecutor's ranks and local ranks across the hosts, a 2x2 dist_sync job, a lost
worker replaced (max_restarts), Ray Train's DataParallelTrainer with dtrain's backend (and its
restart from a checkpoint), and a host lost mid-job (its raylet killed).

Skipped, with the reason, without Ray, root (namespaces) or the emulated hosts' helper."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest
import torch

ray = pytest.importorskip("ray")

from conftest import BUILD  # noqa: E402

import dtrain.ray  # noqa: E402
from dtrain.ray import RayExecutor  # noqa: E402

HELPER = os.path.join(BUILD, "tests", "programs", "ssh_test_cluster")
HERE = os.path.dirname(os.path.abspath(__file__))


def drive(cluster, case, timeout=240):
    """Runs `case` (a function below, named case_<case>) as a driver on the first host: a fresh
    `python` there, connected to the cluster, as a user's script would be. Its result comes back
    as JSON on the last line of its output; a failed assertion fails the test with its output."""
    argv = ["ip", "netns", "exec", cluster["netns"][0], sys.executable, os.path.abspath(__file__),
            case, json.dumps(cluster)]
    try:
        p = subprocess.run(argv, env=cluster["env"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail("driver %s ran past %d s:\n%s" % (case, timeout, e.output))
    if p.returncode != 0:
        pytest.fail("driver %s exited %d:\n%s" % (case, p.returncode, p.stdout))
    print(p.stdout)
    return json.loads(p.stdout.strip().splitlines()[-1])


def kill_raylet(cluster, host):
    """SIGKILLs the raylet of emulated host `host`; the times it did."""
    killed = []
    for pid in netns_pids(cluster["netns"][host]):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"raylet" in f.read():
                    os.kill(pid, signal.SIGKILL)
                    killed.append(time.monotonic())
        except (OSError, ProcessLookupError):
            pass
    return killed


def netns_pids(ns):
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=10)
    return [int(p) for p in out.stdout.split()]


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("needs root for network namespaces")
    if not os.path.exists(HELPER) or shutil.which("unshare") is None:
        pytest.skip("needs build/tests/programs/ssh_test_cluster and unshare")
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    helper = subprocess.Popen([HELPER, "2"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    line = helper.stdout.readline()
    if not line:
        helper.wait(30)
        pytest.skip("no emulated hosts here (ssh_test_cluster exited %s)" % helper.returncode)
    cluster = json.loads(line)
    # The nodes' processes import this file's functions and the package under test.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE] + sys.path),
               RAY_AUTH_MODE="disabled")
    for name in list(env):
        if name.startswith(("DMLC_", "RAY_ADDRESS")):
            del env[name]
    head = cluster["hosts"][0]
    nodes = []
    logs = tmp_path_factory.mktemp("ray-nodes")
    # Ray's sockets live under its temp folder, and a socket's path has at most 107 bytes.
    short = tempfile.mkdtemp(prefix="dtrain-ray-")
    try:
        for i, (ns, address) in enumerate(zip(cluster["netns"], cluster["hosts"])):
            role = ["--head", "--port", "6379", "--include-dashboard=false"] if i == 0 \
                else ["--address", f"{head}:6379"]
            argv = ["ip", "netns", "exec", ns, "unshare", "--uts", "sh", "-c",
                    f'hostname dtrain-ray-{i} && exec "$0" "$@"', ray_bin, "start", "--block",
                    "--node-ip-address", address, "--num-cpus", "3",
                    f"--temp-dir={short}/{i}", *role]
            nodes.append(subprocess.Popen(argv, env=env, stdout=open(logs / f"node{i}.log", "w"),
                                          stderr=subprocess.STDOUT))
            cluster.setdefault("node_argv", []).append(argv)
            if i == 0:
                time.sleep(3)
        cluster["env"] = env
        drive(cluster, "wait_for_nodes", timeout=150)
        yield cluster
    finally:
        for p in nodes:
            p.terminate()
        for p in nodes:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        for ns in cluster["netns"]:  # whatever Ray left there
            for pid in netns_pids(ns):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        helper.stdin.close()
        helper.wait(60)
        shutil.rmtree(short, ignore_errors=True)


def where_am_i():
    import socket

    import dtrain.torch as hvd

    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum)
    out = (hvd.rank(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(),
           socket.gethostname(), float(total[0]))
    hvd.shutdown()
    return out


def case_wait_for_nodes(cluster):
    """Until two nodes are alive, not counting those the cluster says were lost ("lost")."""
    lost = set(cluster.get("lost", []))
    deadline = time.monotonic() + 120
    while len([n for n in ray.nodes() if n["Alive"] and n["NodeID"] not in lost]) < 2:
        assert time.monotonic() < deadline, "the two Ray nodes did not join within 120 s"
        time.sleep(0.5)
    return len(ray.nodes())


def case_ranks(cluster):
    executor = RayExecutor(num_workers=4, placement_strategy="SPREAD")
    executor.start()
    try:
        return executor.run(where_am_i)
    finally:
        executor.shutdown()


def test_ranks_are_grouped_by_host_with_their_local_ranks(hosts):
    results = drive(hosts, "ranks")
    names = [r[4] for r in results]
    # Two ranks a host, a host's ranks consecutive, local ranks 0 and 1 on each.
    assert sorted(set(names)) == ["dtrain-ray-0", "dtrain-ray-1"], results
    assert names[0] == names[1] and names[2] == names[3] and names[1] != names[2], results
    assert [r[:4] for r in results] == [[0, 0, 2, 0], [1, 1, 2, 0], [2, 0, 2, 1],
                                        [3, 1, 2, 1]], results
    assert all(r[5] == 6.0 for r in results), results


def kv_rounds(rounds):
    import dtrain

    kv = dtrain.kv.create("dist_sync")
    kv.init(7, torch.zeros(1000))
    for r in range(rounds):
        kv.push(7, torch.full((1000,), float(kv.rank + 1)))
        got = kv.pull(7)
        assert float(got[0]) == 3.0 and float(got[-1]) == 3.0, (r, got[:3])
    return kv.rank


def case_dist_sync(cluster):
    executor = RayExecutor(num_workers=2, num_servers=2, placement_strategy="SPREAD")
    executor.start()
    try:
        return executor.run(kv_rounds, args=[50])
    finally:
        executor.shutdown()


def test_a_2x2_dist_sync_job_across_the_hosts(hosts):
    assert drive(hosts, "dist_sync") == [0, 1]


def case_restart(cluster):
    from test_ray import kv_rounds_losing_rank_1  # rank 1's first actor dies before round 5

    executor = RayExecutor(num_workers=2, num_servers=1, max_restarts=1,
                           placement_strategy="SPREAD")
    executor.start()
    try:
        return {"results": executor.run(kv_rounds_losing_rank_1, args=[10]),
                "hosts": [p.hostname for p in executor.places]}
    finally:
        executor.shutdown()


def test_a_lost_worker_is_replaced_and_rejoins_across_the_hosts(hosts):
    out = drive(hosts, "restart")
    assert out["results"] == [[0, 0, False], [1, 5, True]], out
    print("the workers' hosts, the replacement's last:", out["hosts"])


def train_across(config):
    import socket

    from test_ray import report_with_rank_0s_checkpoint

    import dtrain.torch as hvd

    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
    hosts = [None] * hvd.size()
    hosts[hvd.rank()] = socket.gethostname()
    hosts = hvd.allgather_object(hosts)
    report_with_rank_0s_checkpoint(
        {"sum": float(total[0]), "hosts": sorted({h for hs in hosts for h in hs if h})}, total)


def fit(train_fn, max_failures=0):
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    # Shared by the hosts, as a cluster's storage would be: they share this machine's files.
    storage = tempfile.mkdtemp(prefix="dtrain-ray-train-")
    try:
        trainer = DataParallelTrainer(
            train_fn, backend_config=dtrain.ray.Config(timeout_s=30),
            scaling_config=ScalingConfig(num_workers=4, placement_strategy="SPREAD"),
            run_config=RunConfig(storage_path=storage, name="job",
                                 failure_config=FailureConfig(max_failures=max_failures)))
        result = trainer.fit()
        assert result.error is None, result.error
        return result.metrics
    finally:
        shutil.rmtree(storage, ignore_errors=True)


def case_ray_train(cluster):
    return fit(train_across)


def case_ray_train_restart(cluster):
    from test_ray import train_resuming  # rank 1 dies in the first life, after epoch 1

    return fit(train_resuming, max_failures=1)


def test_ray_train_runs_a_dtrain_job_across_the_hosts(hosts):
    metrics = drive(hosts, "ray_train")
    assert metrics == {"sum": 10.0, "hosts": ["dtrain-ray-0", "dtrain-ray-1"]}, metrics


def test_ray_train_restarts_the_group_across_the_hosts_from_its_checkpoint(hosts):
    metrics = drive(hosts, "ray_train_restart")
    # Four ranks: epoch 2's allreduce sums 2 four times.
    assert metrics["epoch"] == 2 and metrics["sum"] == 8.0, metrics
    assert metrics["resumed"] in (1, 2), metrics


def allreduce_until_stopped():
    import dtrain.torch as hvd

    hvd.init()
    for _ in range(100000):
        hvd.allreduce(torch.ones(10000))
        time.sleep(0.001)


def case_host_lost(cluster):
    executor = RayExecutor(num_workers=4, placement_strategy="SPREAD")
    executor.start()
    # The second host's raylet: the head's would take the cluster's control plane and this driver
    # (Ray ends a driver whose cluster is gone) with it. dtrain-ray-<i> runs in netns i.
    host = 1
    assert "dtrain-ray-1" in {p.hostname for p in executor.places}, executor.places
    killed = []
    timer = threading.Timer(3.0, lambda: killed.extend(kill_raylet(cluster, host)))
    timer.start()
    try:
        executor.run(allreduce_until_stopped)
    except RuntimeError as e:
        assert killed, "no raylet in the second host"
        return {"error": str(e), "after_s": time.monotonic() - killed[0]}
    finally:
        timer.cancel()
        executor.shutdown()
    raise AssertionError("run returned although a host was lost")


def elastic_until(steps, started):
    import socket

    import dtrain.torch as hvd

    hvd.init()
    state = hvd.elastic.ObjectState(step=0)

    @hvd.elastic.run
    def train(state):
        while state.step < steps:
            hvd.allreduce(torch.ones(1000))
            if state.step == 5:
                open(started, "a").close()  # the job is under way: the host may go
            time.sleep(0.05)
            state.step += 1
            state.commit()
        return state.step, hvd.size(), socket.gethostname()

    return train(state)


def case_elastic_host_lost(cluster):
    from dtrain.ray import ElasticRayExecutor

    started = os.path.join(tempfile.mkdtemp(prefix="dtrain-ray-elastic-"), "started")
    killed = []

    def kill_when_started():
        deadline = time.monotonic() + 120
        while not os.path.exists(started) and time.monotonic() < deadline:
            time.sleep(0.1)
        killed.extend(kill_raylet(cluster, 1))

    thread = threading.Thread(target=kill_when_started, daemon=True)
    thread.start()
    executor = ElasticRayExecutor(ElasticRayExecutor.create_settings(min_np=1, max_np=4,
                                                                     elastic_timeout=60))
    executor.start()
    lost = [n["NodeID"] for n in ray.nodes()
            if n["Alive"] and n["NodeManagerAddress"] == cluster["hosts"][1]]
    results = executor.run(elastic_until, args=(300, started))
    thread.join(5)
    assert killed, "the second host's raylet was not killed"
    return {"results": results, "lost": lost}


# Last: they lose one host's node.
def test_an_elastic_job_goes_on_when_a_host_is_lost(hosts, tmp_path):
    out = {"results": None, "lost": []}
    try:
        out = drive(hosts, "elastic_host_lost", timeout=400)
    finally:  # the second host's node again, for the next test (the fixture ends it)
        subprocess.Popen(hosts["node_argv"][1], env=hosts["env"],
                         stdout=open(tmp_path / "node1-again.log", "w"), stderr=subprocess.STDOUT)
        drive(dict(hosts, lost=out["lost"]), "wait_for_nodes", timeout=150)
    results = out["results"]
    # The job ended on the first host's workers alone, every one through all the steps.
    assert results and all(r[0] == 300 and r[1] == len(results) and r[2] == "dtrain-ray-0"
                           for r in results), results


def test_a_host_lost_mid_job_fails_run_naming_a_rank(hosts):
    out = drive(hosts, "host_lost")
    assert re.search(r"rank [0-3] on node \S+ \(dtrain-ray-[01]\) failed", out["error"]), out
    print("run raised %.1f s after the raylet's kill" % out["after_s"])


if __name__ == "__main__":  # a driver on the first host (drive above)
    cluster = json.loads(sys.argv[2])
    ray.init(address=f"{cluster['hosts'][0]}:6379", log_to_driver=True)
    try:
        result = globals()["case_" + sys.argv[1]](cluster)
    finally:
        ray.shutdown()
    print(json.dumps(result))
