"""`dtrain launch --launcher kubernetes` without --dry-run: the job's objects created through the
API with Kubernetes' official Python client, its pods followed (output merged and prefixed, the
first failure named with pod, node and reason), every object deleted at the end, on a failure and
on Ctrl-C, and the job's exit code.

No Kubernetes cluster runs on these machines. The launcher talks to kube_standin.py instead: an
API server on loopback that the unchanged client reaches through a kubeconfig, whose pods are real
processes (its docstring says what it does as Kubernetes does and what it does not: real nodes,
images, scheduling, admission, backoff delays, Kubeflow's operator). Where a cluster is at hand,
test_a_2x2_job_on_a_real_cluster runs on it: set KUBECONFIG and DTRAIN_TEST_KUBERNETES_IMAGE (an
image with dtrain installed)."""

import os
import signal
import subprocess
import time

import pytest

from conftest import DTRAIN, PYTHON, TRAIN, free_port, job_env

pytest.importorskip("kubernetes", reason="Kubernetes' Python client (python3-kubernetes, or pip "
                                         "install 'dtrain[kubernetes]')")
from kube_standin import StandIn  # noqa: E402

SLEEPER = ["sh", "-c", "echo up $DMLC_ROLE $DTRAIN_NODE_RANK; exec sleep 120"]


@pytest.fixture
def cluster(tmp_path):
    """A stand-in cluster whose pods find dtrain's programs on PATH, as in its image."""
    env = job_env()
    env["PATH"] = os.pathsep.join([os.path.dirname(DTRAIN), os.path.dirname(TRAIN),
                                   env["PATH"]])
    standin = StandIn(str(tmp_path), env)
    standin.config = standin.kubeconfig(str(tmp_path / "kubeconfig"))
    standin.launchers = []
    yield standin
    for p in standin.launchers:  # a test that failed early leaves no launcher behind
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    standin.close()


def start(cluster, *options, command=SLEEPER):
    """`dtrain launch --launcher kubernetes OPTIONS -- COMMAND` against the stand-in, running."""
    env = dict(os.environ, KUBECONFIG=cluster.config, DTRAIN_PYTHON=PYTHON)
    env.pop("KUBERNETES_SERVICE_HOST", None)
    p = subprocess.Popen([DTRAIN, "launch", "--launcher", "kubernetes", "--image", "train:1",
                          "--namespace", "ml", *options, "--", *command],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    cluster.launchers.append(p)
    return p


def finish(p, timeout=90):
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        pytest.fail("the launcher did not finish within %d s:\n%s\n%s" % (timeout, out, err))
    return p.returncode, out, err


def assert_nothing_left(cluster):
    assert cluster.objects == {}, sorted(cluster.objects)
    deadline = time.monotonic() + 10
    while cluster.running_processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert cluster.running_processes() == []


def test_a_job_runs_to_the_end_with_its_output_merged_and_leaves_nothing(cluster):
    p = start(cluster, "-n", "2", "-s", "0", "--name", "ok",
              command=["sh", "-c", "echo hello from $DMLC_ROLE $DTRAIN_NODE_RANK of "
                       "$DMLC_NUM_WORKER at $DMLC_PS_ROOT_URI; test ${#DTRAIN_JOB_SECRET} = 64"])
    code, out, err = finish(p)
    assert code == 0, err
    assert "[worker 0] hello from worker 0 of 2 at ok-rank0\n" in out, out
    assert "[worker 1] hello from worker 1 of 2 at ok-rank0\n" in out, out
    assert "created Secret ok-secret, Service ok-rank0, Job ok-worker in namespace ml" in err
    assert "deleted the job's 3 objects" in err, err
    posts = [path for method, path in cluster.requests if method == "POST"]
    assert posts == ["/api/v1/namespaces/ml/secrets", "/api/v1/namespaces/ml/services",
                     "/apis/batch/v1/namespaces/ml/jobs"]
    deletes = [path for method, path in cluster.requests if method == "DELETE"]
    assert deletes == ["/apis/batch/v1/namespaces/ml/jobs/ok-worker",
                       "/api/v1/namespaces/ml/services/ok-rank0",
                       "/api/v1/namespaces/ml/secrets/ok-secret"]
    assert cluster.unauthorized == 0
    assert_nothing_left(cluster)


FAIL_RANK_1 = 'if [ "$DTRAIN_NODE_RANK" = 1 ]; then {}; fi; exec sleep 120'


@pytest.mark.parametrize("options,script,named,code", [
    ((), "echo dying; exit 3", "worker 1 (pod fail-worker-1-", 3),
    (("--worker-memory", "1Gi"), "kill -9 $$", "OOMKilled, exit code 137", 137),
    (("--image", "registry.example/unpullable:1"), "true",
     'ImagePullBackOff: Back-off pulling image "registry.example/unpullable:1"', 1),
], ids=["exit-code", "oom-killed", "image-pull"])
def test_the_first_failure_is_named_and_the_job_deleted(cluster, options, script, named, code):
    p = start(cluster, "-n", "2", "-s", "0", "--name", "fail", *options,
              command=["sh", "-c", FAIL_RANK_1.format(script)])
    got, out, err = finish(p)
    assert got == code, err
    assert named in err and "stopping the job" in err, err
    if "unpullable" not in str(options):
        assert " on node-b)" in err, err  # the node the pod ran on
    assert "deleted the job's 3 objects" in err, err
    assert_nothing_left(cluster)


def test_an_evicted_pod_is_named_with_the_kubelets_message(cluster):
    p = start(cluster, "-n", "2", "-s", "0", "--name", "ev")
    victim = cluster.pod("worker", 0)
    cluster.pod("worker", 1)
    time.sleep(1)  # the launcher follows both logs
    cluster.evict(victim)
    code, out, err = finish(p)
    assert code == 137, err
    assert "worker 0 (pod %s on node-a): Evicted, exit code 137: The node was low on resource: " \
           "memory." % victim.name in err, err
    assert "[worker 0] up worker 0" in out and "[worker 1] up worker 1" in out, out
    assert_nothing_left(cluster)


def test_a_pod_deleted_by_hand_fails_the_job_through_its_jobs_condition(cluster):
    """`kubectl delete pod` (or a node's drain): the pod ends without failing, but the Job
    controller counts it against backoffLimit, fails the Job and removes its other pods. The
    launcher reads the Job's Failed condition instead of waiting for pods that never come."""
    p = start(cluster, "-n", "2", "-s", "0", "--name", "del")
    victim = cluster.pod("worker", 0)
    cluster.pod("worker", 1)
    cluster.delete_pod(victim)
    code, out, err = finish(p, timeout=60)
    assert code == 1, err
    assert "Job del-worker failed: BackoffLimitExceeded: Job has reached the specified backoff " \
           "limit; stopping the job" in err, err
    assert_nothing_left(cluster)


def test_a_name_taken_by_another_job_leaves_that_job_alone(cluster):
    """409 AlreadyExists: the launcher deletes only what it created, never the other job's."""
    first = start(cluster, "-n", "1", "-s", "0", "--name", "taken")
    cluster.pod("worker", 0)
    code, out, err = finish(start(cluster, "-n", "1", "-s", "0", "--name", "taken"))
    assert code == 1 and "creating Secret ml/taken-secret: the API server at %s answered 409" \
        % cluster.url in err, err
    assert ("secrets", "taken-secret") in cluster.objects  # the first job's, untouched
    assert not [r for r in cluster.requests if r[0] == "DELETE"], cluster.requests
    os.kill(first.pid, signal.SIGINT)
    assert finish(first, timeout=60)[0] == 130
    assert_nothing_left(cluster)


def test_ctrl_c_deletes_every_object(cluster):
    p = start(cluster, "-n", "3", "-s", "0", "--name", "intr")
    for rank in range(3):
        cluster.pod("worker", rank)
    time.sleep(0.5)  # the launcher has seen them run
    os.kill(p.pid, signal.SIGINT)
    code, out, err = finish(p, timeout=60)
    assert code == 130, err
    assert "interrupted: deleting the job" in err and "deleted the job's 3 objects" in err, err
    assert_nothing_left(cluster)


def test_pods_that_cannot_be_scheduled_are_named_at_the_start_deadline(cluster):
    p = start(cluster, "-n", "2", "-s", "0", "--name", "big", "--worker-cpu", "64",
              "--start-timeout", "3")
    code, out, err = finish(p)
    assert code == 1, err
    assert "not started within 3 s (--start-timeout): worker 0 (pod big-worker-0-" in err, err
    assert "Unschedulable: 0/2 nodes are available: 2 Insufficient cpu." in err, err
    assert_nothing_left(cluster)


def test_kubeflow_objects_go_through_the_custom_objects_api(cluster):
    """--kubeflow: the PyTorchJob is created and deleted through Kubeflow's API group. Nothing
    runs it here (no operator), so its pods never come: the start deadline names them."""
    p = start(cluster, "-n", "2", "-s", "0", "--name", "kf", "--kubeflow",
              "--start-timeout", "2")
    code, out, err = finish(p)
    assert code == 1 and "worker 0 (no pod yet); worker 1 (no pod yet)" in err, err
    assert ("POST", "/apis/kubeflow.org/v1/namespaces/ml/pytorchjobs") in cluster.requests
    assert ("DELETE", "/apis/kubeflow.org/v1/namespaces/ml/pytorchjobs/kf") in cluster.requests
    assert_nothing_left(cluster)


def test_an_api_server_that_refuses_or_is_absent_is_named(cluster, tmp_path):
    cluster.token = "another"  # the kubeconfig's token is now wrong: 401
    code, out, err = finish(start(cluster, "-n", "1", "-s", "0", "--name", "auth"))
    assert code == 1 and "creating Secret ml/auth-secret: the API server at %s answered 401" \
        % cluster.url in err, err
    port = free_port()
    config = tmp_path / "absent"
    config.write_text(open(cluster.config).read().replace(cluster.url,
                                                          "http://127.0.0.1:%d" % port))
    cluster.config = str(config)
    code, out, err = finish(start(cluster, "-n", "1", "-s", "0", "--name", "gone"))
    assert code == 1 and "cannot reach the API server at http://127.0.0.1:%d" % port in err, err


def needs_hosts_mapping():
    if os.geteuid() != 0:
        pytest.skip("the pods' hosts file is bind-mounted in a mount namespace: needs root")


def test_the_2x2_main_job_trains_through_the_launcher(cluster):
    """The parameter-server job as the manifests describe it: the scheduler and servers run
    `dtrain scheduler` / `dtrain server`, the workers dtrain-train, meeting at the Service's
    name (each pod's hosts file maps it, as cluster DNS would)."""
    needs_hosts_mapping()
    cluster.hosts = {"main-scheduler": "127.0.0.1"}
    p = start(cluster, "-n", "2", "-s", "2", "--name", "main", "--port", str(free_port()),
              command=["dtrain-train", "--dataset", "fashion-mnist", "--network", "lenet",
                       "--kvstore", "dist_sync", "--epochs", "1", "--limit-train", "6000",
                       "--log-interval", "0"])
    code, out, err = finish(p, timeout=400)
    assert code == 0, out + err
    assert "[worker 0] " in out and "[worker 1] " in out and "Test_acc" in out, out
    assert "deleted the job's 5 objects" in err, err
    assert_nothing_left(cluster)


def test_max_restarts_lets_the_job_replace_a_failed_worker(cluster, tmp_path):
    """--max-restarts 1: worker 1's first pod fails; its Job starts another with the same index,
    which the scheduler takes as worker 1, and the job completes."""
    needs_hosts_mapping()
    cluster.hosts = {"rs-scheduler": "127.0.0.1"}
    marker = tmp_path / "failed-once"
    script = ('if [ "$DTRAIN_NODE_RANK" = 1 ] && [ ! -e {m} ]; then touch {m}; exit 5; fi; '
              'exec dtrain-train --dataset fashion-mnist --network mlp --kvstore dist_sync '
              '--epochs 1 --limit-train 2000 --log-interval 0').format(m=marker)
    p = start(cluster, "-n", "2", "-s", "1", "--name", "rs", "--max-restarts", "1",
              "--port", str(free_port()), command=["sh", "-c", script])
    code, out, err = finish(p, timeout=400)
    assert code == 0, out + err
    assert "worker 1 (pod rs-worker-1-" in err and "Error, exit code 5; its Job starts " \
        "another pod for it (restart 1 of 1)" in err, err
    assert_nothing_left(cluster)


@pytest.mark.skipif(not (os.environ.get("KUBECONFIG") and
                         os.environ.get("DTRAIN_TEST_KUBERNETES_IMAGE")),
                    reason="opt-in: set KUBECONFIG and DTRAIN_TEST_KUBERNETES_IMAGE (an image "
                           "with dtrain) to run a job on a real cluster")
def test_a_2x2_job_on_a_real_cluster():
    p = subprocess.run(
        [DTRAIN, "launch", "--launcher", "kubernetes", "-n", "2", "-s", "2",
         "--image", os.environ["DTRAIN_TEST_KUBERNETES_IMAGE"],
         "--namespace", os.environ.get("DTRAIN_TEST_KUBERNETES_NAMESPACE", "default"), "--",
         "dtrain-train", "--dataset", "fashion-mnist", "--network", "lenet", "--kvstore",
         "dist_sync", "--epochs", "1", "--log-interval", "0"],
        capture_output=True, text=True, timeout=1800, env=dict(os.environ, DTRAIN_PYTHON=PYTHON))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "[worker 0] " in p.stdout and "Test_acc" in p.stdout, p.stdout
