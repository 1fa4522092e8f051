"""`dtrain launch --launcher kubernetes --dry-run`: the manifests a job's pods run from, checked
strictly (an unknown field is an error) against the official OpenAPI schemas of Kubernetes 1.30
and 1.37, as PyPI's kubernetes-validate bundles them (offline); the job secret fresh per run and
only ever referenced from the pods; the pods' environment what dtrain's roles read.

Creating the objects and following the pods is test_kubernetes_api.py's (against a stand-in API
server: no Kubernetes cluster runs on these machines). tests/network/kubernetes_pods_test.sh runs
the pods these manifests describe, and tests/network/pod_start_order_test.sh real processes under
Kubeflow MXJob's environment."""

import os
import subprocess

import pytest

from conftest import DTRAIN, PYTHON, free_port, job_env, program

yaml = pytest.importorskip("yaml")

VERSIONS = ("1.30.0", "1.37.0")
ENV = dict(os.environ, DTRAIN_PYTHON=PYTHON)  # the package under test runs the launcher


def launch(*args):
    """`dtrain launch ARGS...`, finished."""
    return subprocess.run([DTRAIN, "launch", *args], capture_output=True, text=True, timeout=120,
                          env=ENV)


def dry_run(*options, command=("python3", "train.py", "--kvstore", "dist_sync")):
    p = launch("--launcher", "kubernetes", *options, "--dry-run", "--", *command)
    assert p.returncode == 0, p.stderr
    return list(yaml.safe_load_all(p.stdout))


def by_kind(docs):
    return [(d["kind"], d["metadata"]["name"]) for d in docs]


def env_of(job):
    return {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}


PS_JOB = ("-n", "2", "-s", "2", "--image", "registry.example/team/train:1", "--name", "demo",
          "--namespace", "ml", "--worker-cpu", "2", "--worker-memory", "4Gi", "--worker-gpus", "1",
          "--server-cpu", "1", "--max-restarts", "3", "--env", "OMP_NUM_THREADS:2")
ALLREDUCE_JOB = ("-n", "4", "-s", "0", "--image", "train:1", "--name", "hvd")


@pytest.mark.parametrize("options", [PS_JOB, ALLREDUCE_JOB], ids=["ps", "allreduce"])
def test_every_manifest_validates_strictly_against_both_schemas(options):
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    docs = dry_run(*options)
    for doc in docs:
        for version in VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)
    # The validator is strict: a field Kubernetes does not know is an error.
    docs[-1]["spec"]["template"]["spec"]["containers"][0]["cpus"] = 2
    with pytest.raises(kubernetes_validate.ValidationError, match="cpus"):
        kubernetes_validate.validate(docs[-1], VERSIONS[0], strict=True)


def test_a_parameter_server_jobs_objects_and_environment():
    docs = dry_run(*PS_JOB)
    assert by_kind(docs) == [("Secret", "demo-secret"), ("Service", "demo-scheduler"),
                             ("Job", "demo-scheduler"), ("Job", "demo-server"),
                             ("Job", "demo-worker")]
    assert all(d["metadata"]["namespace"] == "ml" for d in docs)
    service = docs[1]["spec"]
    assert service["clusterIP"] == "None" and service["ports"][0]["port"] == 9091
    assert service["selector"] == {"dtrain.job": "demo", "dtrain.role": "scheduler"}
    scheduler, server, worker = docs[2], docs[3], docs[4]
    assert scheduler["spec"]["template"]["spec"]["containers"][0]["command"] == [
        "dtrain", "scheduler"]
    assert server["spec"]["completions"] == 2 and worker["spec"]["completions"] == 2
    assert worker["spec"]["completionMode"] == "Indexed"
    assert worker["spec"]["backoffLimit"] == 3
    pod = worker["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    container = pod["containers"][0]
    assert container["command"] == ["python3", "train.py", "--kvstore", "dist_sync"]
    assert container["resources"]["limits"] == {"cpu": "2", "memory": "4Gi",
                                                "nvidia.com/gpu": "1"}
    env = env_of(worker)
    assert {k: env[k].get("value") for k in ("DMLC_ROLE", "DMLC_PS_ROOT_URI",
                                             "DMLC_PS_ROOT_PORT", "DMLC_NUM_SERVER",
                                             "DMLC_NUM_WORKER", "OMP_NUM_THREADS")} == {
        "DMLC_ROLE": "worker", "DMLC_PS_ROOT_URI": "demo-scheduler", "DMLC_PS_ROOT_PORT": "9091",
        "DMLC_NUM_SERVER": "2", "DMLC_NUM_WORKER": "2", "OMP_NUM_THREADS": "2"}
    # Its rank is its completion index, its address its pod's IP.
    assert "job-completion-index" in env["DTRAIN_NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert env["DMLC_NODE_HOST"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"


def test_an_allreduce_job_meets_at_rank_0():
    docs = dry_run(*ALLREDUCE_JOB)
    assert by_kind(docs) == [("Secret", "hvd-secret"), ("Service", "hvd-rank0"),
                             ("Job", "hvd-worker")]
    assert docs[1]["spec"]["selector"]["batch.kubernetes.io/job-completion-index"] == "0"
    assert env_of(docs[2])["DMLC_NUM_SERVER"]["value"] == "0"


def test_the_job_secret_is_fresh_and_pods_only_reference_it():
    first, second = dry_run(*PS_JOB), dry_run(*PS_JOB)
    secret = first[0]["stringData"]["DTRAIN_JOB_SECRET"]
    assert len(secret) == 64 and secret != second[0]["stringData"]["DTRAIN_JOB_SECRET"]
    for job in first[2:]:
        env = env_of(job)["DTRAIN_JOB_SECRET"]
        assert "value" not in env
        assert env["valueFrom"]["secretKeyRef"] == {"name": "demo-secret",
                                                    "key": "DTRAIN_JOB_SECRET"}
        assert secret not in yaml.safe_dump(job)


def test_kubeflow_objects_leave_the_environment_to_the_operator():
    """--kubeflow: an MXJob (with servers) or a PyTorchJob (-s 0) beside the Secret. Their kinds
    are Kubeflow's CRDs, whose schemas kubernetes-validate does not bundle: their structure is
    checked here, the Secret against the schemas; the environment the operator adds is
    test_horovods_api_under_a_pytorchjobs_environment's and pod_start_order_test.sh's."""
    mx = dry_run("-n", "2", "-s", "3", "--image", "x:1", "--name", "kf", "--kubeflow",
                 "--max-restarts", "2")
    assert by_kind(mx) == [("Secret", "kf-secret"), ("MXJob", "kf")]
    job = mx[1]
    assert job["apiVersion"] == "kubeflow.org/v1" and job["spec"]["jobMode"] == "MXTrain"
    assert job["spec"]["runPolicy"]["backoffLimit"] == 2
    replicas = job["spec"]["mxReplicaSpecs"]
    assert {k: v["replicas"] for k, v in replicas.items()} == {"Scheduler": 1, "Server": 3,
                                                               "Worker": 2}
    for role, replica in replicas.items():
        (container,) = replica["template"]["spec"]["containers"]
        assert container["name"] == "mxnet" and container["ports"][0]["name"] == "mxjob-port"
        # No DMLC_*; --max-restarts keeps a failed worker's rank for its replacement.
        assert [e["name"] for e in container["env"]] == ["DTRAIN_JOB_SECRET",
                                                         "DTRAIN_RESTART_WAIT_MS"]
        assert "secretKeyRef" in container["env"][0]["valueFrom"]
        # The operator's backoffLimit counts container restarts: they restart in their pods.
        assert replica["restartPolicy"] == "OnFailure"
    assert replicas["Scheduler"]["template"]["spec"]["containers"][0]["command"] == [
        "dtrain", "scheduler"]
    pt = dry_run("-n", "3", "-s", "0", "--image", "x:1", "--name", "pt", "--kubeflow")
    assert by_kind(pt) == [("Secret", "pt-secret"), ("PyTorchJob", "pt")]
    replicas = pt[1]["spec"]["pytorchReplicaSpecs"]
    assert {k: v["replicas"] for k, v in replicas.items()} == {"Master": 1, "Worker": 2}
    assert replicas["Master"]["template"]["spec"]["containers"][0]["name"] == "pytorch"
    assert replicas["Master"]["restartPolicy"] == "Never"  # no --max-restarts
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for version in VERSIONS:
        kubernetes_validate.validate(mx[0], version, strict=True)


@pytest.mark.parametrize("options,message", [
    (("-n", "2", "--image", "x:1", "--name", "Bad_Name"), "job name 'Bad_Name'"),
    (("-n", "2", "--image", "x:1", "--env", "DMLC_ROLE:server"), "sets it itself"),
    (("-n", "2", "--name", "x"), "--image"),
    (("-n", "2", "--image", "x:1", "--max-restarts", "-1"), "--max-restarts"),
    (("-n", "2", "-s", "0", "--image", "x:1", "--max-restarts", "1"), "parameter-server jobs"),
    (("-n", "2", "--image", "x:1", "--start-timeout", "0"), "--start-timeout"),
])
def test_bad_options_are_named(options, message):
    p = launch("--launcher", "kubernetes", *options, "--dry-run", "--", "python3", "t.py")
    assert p.returncode == 2 and message in p.stderr, p.stderr


def test_horovods_api_under_a_pytorchjobs_environment(spawn):
    """Two ranks started with the environment Kubeflow's PyTorchJob gives its pods
    (kubeflow/training-operator, pkg/controller.v1/pytorch/envvar.go and master.go: MASTER_ADDR,
    MASTER_PORT, WORLD_SIZE, RANK, PYTHONUNBUFFERED=0; no dtrain or Horovod variable): they meet at
    MASTER_ADDR:MASTER_PORT, and programs/hvd_worker.py checks Horovod's API exactly (without the
    mapping each would be a job of one, and rank 1 would say "rank 0 of 1")."""
    port = free_port()
    ranks = []
    for rank in range(2):
        env = {k: v for k, v in job_env().items() if not k.startswith("HOROVOD_")}
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2",
                   RANK=str(rank), PYTHONUNBUFFERED="0")
        ranks.append(spawn(program("hvd_worker.py", "--no-launcher"), env))
    for rank, p in enumerate(ranks):
        assert p.wait(180) == 0, p.output()
        assert "hvd_worker OK rank %d of 2" % rank in p.output(), p.output()
