"""The Kubernetes objects of a dtrain job, as `dtrain launch --launcher kubernetes` creates them
(or prints them, with ``--dry-run``): built-in kinds only, so that any cluster runs them.

- a Secret holding the job's secret (a fresh random one per job): pods read it through
  ``secretKeyRef``, never as a literal in their spec;
- a headless Service for the rendezvous: the scheduler's pod (parameter-server jobs) or rank 0's
  (allreduce jobs, ``-s 0``), so that ``DMLC_PS_ROOT_URI`` is a stable name. It publishes its pod
  before the pod is Ready (there is no readiness probe to wait for), and dtrain retries the name
  until it resolves either way;
- one Indexed Job per role (scheduler, servers, workers): a pod's completion index is its rank
  (``DTRAIN_NODE_RANK``), its own address is its pod IP (``DMLC_NODE_HOST``), restartPolicy Never,
  and ``backoffLimit`` the job's ``--max-restarts``.

The scheduler and servers run ``dtrain scheduler`` and ``dtrain server`` from the same image as
the workers, which run the user's command.

With ``kubeflow=True`` (``--kubeflow``) the roles are one object of Kubeflow's training operator
instead, which then creates the pods, their Services and their environment: an MXJob
(kubeflow.org/v1) for a parameter-server job, whose pods get MXNet's DMLC_* variables and
MX_CONFIG, or a PyTorchJob for an allreduce job (Master: rank 0; Workers: the others), whose pods
get MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK. The Secret stays a built-in object.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, field
from typing import Any

__all__ = ["JobSpec", "RoleResources", "manifests"]

_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
RANK_OFFSET = "dtrain.rank-offset"  # read back by dtrain.kubernetes.pods


@dataclass
class RoleResources:
    """A role's requests, which are also its limits: ``cpu`` and ``memory`` in Kubernetes'
    quantities ('2', '500m', '4Gi'), ``gpus`` NVIDIA GPUs (``nvidia.com/gpu``)."""

    cpu: str | None = None
    memory: str | None = None
    gpus: int = 0

    def to_k8s(self) -> dict[str, Any]:
        amounts: dict[str, Any] = {}
        if self.cpu:
            amounts["cpu"] = self.cpu
        if self.memory:
            amounts["memory"] = self.memory
        if self.gpus:
            amounts["nvidia.com/gpu"] = str(self.gpus)
        return {"requests": dict(amounts), "limits": dict(amounts)} if amounts else {}


@dataclass
class JobSpec:
    name: str
    image: str
    command: list[str]
    num_workers: int
    num_servers: int
    namespace: str = "default"
    port: int = 9091
    max_restarts: int = 0
    env: dict[str, str] = field(default_factory=dict)
    worker: RoleResources = field(default_factory=RoleResources)
    server: RoleResources = field(default_factory=RoleResources)
    image_pull_policy: str | None = None
    kubeflow: bool = False

    def check(self) -> None:
        # Pods are named <job>-<role>-<index>-<5 chars>: the job's name leaves room for that.
        if not _NAME.match(self.name) or len(self.name) > 40:
            raise ValueError("job name %r: lowercase letters, digits and '-', starting with a "
                             "letter, at most 40 characters (Kubernetes names pods after it)"
                             % self.name)
        if not self.image:
            raise ValueError("--image is required: the container image every pod runs")
        if not self.command:
            raise ValueError("no command given: name the workers' command after the options")
        if self.num_workers < 1 or self.num_servers < 0:
            raise ValueError("-n must be at least 1 and -s at least 0")
        if not 1 <= self.port <= 65535:
            raise ValueError("--port %d is outside 1..65535" % self.port)
        if self.max_restarts > 0 and self.num_servers == 0:
            raise ValueError("--max-restarts replaces workers of parameter-server jobs; an "
                             "allreduce job (-s 0) cannot take a new rank in the middle of its "
                             "collectives")
        for key in self.env:
            if key.startswith("DMLC_") or key == "DTRAIN_JOB_SECRET":
                raise ValueError("--env %s: the launcher sets it itself" % key)

    @property
    def rendezvous(self) -> str:
        """The Service naming the scheduler (or rank 0)."""
        return "%s-%s" % (self.name, "scheduler" if self.num_servers else "rank0")

    @property
    def secret_name(self) -> str:
        return self.name + "-secret"


def _labels(spec: JobSpec, role: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "dtrain", "dtrain.job": spec.name, "dtrain.role": role}


def _env(spec: JobSpec, role: str) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": "DMLC_ROLE", "value": role},
        {"name": "DMLC_PS_ROOT_URI", "value": spec.rendezvous},
        {"name": "DMLC_PS_ROOT_PORT", "value": str(spec.port)},
        {"name": "DMLC_NUM_SERVER", "value": str(spec.num_servers)},
        {"name": "DMLC_NUM_WORKER", "value": str(spec.num_workers)},
        {"name": "DMLC_NODE_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "DTRAIN_NODE_RANK",
         "valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX}}},
    ]
    return env + _own_env(spec)


def _own_env(spec: JobSpec) -> list[dict[str, Any]]:
    """What every pod gets whoever starts it: the job secret (by reference) and --env's."""
    secret = {"name": "DTRAIN_JOB_SECRET",
              "valueFrom": {"secretKeyRef": {"name": spec.secret_name, "key": "DTRAIN_JOB_SECRET"}}}
    env = dict(spec.env)
    if spec.max_restarts > 0:
        # As `dtrain launch --max-restarts` locally: the scheduler keeps a failed worker's rank
        # for its replacement (the Job's next pod of that index) this long.
        env.setdefault("DTRAIN_RESTART_WAIT_MS", "60000")
    return [secret] + [{"name": k, "value": v} for k, v in sorted(env.items())]


def _container(spec: JobSpec, name: str, command: list[str], env: list[dict[str, Any]],
               resources: RoleResources, port_name: str | None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": name, "image": spec.image, "command": command,
                                 "env": env}
    if spec.image_pull_policy:
        container["imagePullPolicy"] = spec.image_pull_policy
    if port_name:
        container["ports"] = [{"name": port_name, "containerPort": spec.port}]
    k8s_resources = resources.to_k8s()
    if k8s_resources:
        container["resources"] = k8s_resources
    return container


def _job(spec: JobSpec, role: str, count: int, command: list[str],
         resources: RoleResources) -> dict[str, Any]:
    # The scheduler's port is the one its Service names.
    container = _container(spec, role, command, _env(spec, role), resources,
                           "dtrain" if role == "scheduler" else None)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "%s-%s" % (spec.name, role), "namespace": spec.namespace,
                     "labels": _labels(spec, role)},
        "spec": {
            "completions": count,
            "parallelism": count,
            "completionMode": "Indexed",
            "backoffLimit": spec.max_restarts,
            "template": {
                "metadata": {"labels": _labels(spec, role)},
                "spec": {"restartPolicy": "Never", "containers": [container]},
            },
        },
    }


def _kubeflow_replica(spec: JobSpec, role: str, count: int, container_name: str,
                      command: list[str], resources: RoleResources, port_name: str,
                      rank_offset: int = 0) -> dict[str, Any]:
    # The operator adds the rest of the environment, and takes the rendezvous port from this one.
    container = _container(spec, container_name, command, _own_env(spec), resources, port_name)
    labels = _labels(spec, role)
    if rank_offset:
        # The operator labels pods with their replica index; the launcher adds this for the rank.
        labels[RANK_OFFSET] = str(rank_offset)
    # The operator's backoffLimit counts container restarts, which restartPolicy Never has none
    # of: with --max-restarts a failed container restarts in its pod.
    policy = "OnFailure" if spec.max_restarts else "Never"
    return {"replicas": count, "restartPolicy": policy,
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}}}


def _kubeflow_job(spec: JobSpec) -> dict[str, Any]:
    metadata = {"name": spec.name, "namespace": spec.namespace, "labels": _labels(spec, "job")}
    run_policy = {"backoffLimit": spec.max_restarts}
    if spec.num_servers:
        # MXJob's container is named "mxnet", its port "mxjob-port" (the operator's defaults).
        replicas = {
            "Scheduler": _kubeflow_replica(spec, "scheduler", 1, "mxnet", ["dtrain", "scheduler"],
                                           spec.server, "mxjob-port"),
            "Server": _kubeflow_replica(spec, "server", spec.num_servers, "mxnet",
                                        ["dtrain", "server"], spec.server, "mxjob-port"),
            "Worker": _kubeflow_replica(spec, "worker", spec.num_workers, "mxnet",
                                        list(spec.command), spec.worker, "mxjob-port"),
        }
        return {"apiVersion": "kubeflow.org/v1", "kind": "MXJob", "metadata": metadata,
                "spec": {"jobMode": "MXTrain", "runPolicy": run_policy,
                         "mxReplicaSpecs": replicas}}
    # PyTorchJob's container is named "pytorch", its port "pytorchjob-port"; RANK 0 is the Master.
    replicas = {"Master": _kubeflow_replica(spec, "worker", 1, "pytorch", list(spec.command),
                                            spec.worker, "pytorchjob-port")}
    if spec.num_workers > 1:
        replicas["Worker"] = _kubeflow_replica(spec, "worker", spec.num_workers - 1, "pytorch",
                                               list(spec.command), spec.worker, "pytorchjob-port",
                                               rank_offset=1)
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": metadata,
            "spec": {"runPolicy": run_policy, "pytorchReplicaSpecs": replicas}}


def manifests(spec: JobSpec, job_secret: str | None = None) -> list[dict[str, Any]]:
    """Every object of the job, in the order to create them. `job_secret`: the Secret's value
    (default: a fresh random one)."""
    spec.check()
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": spec.secret_name, "namespace": spec.namespace,
                     "labels": _labels(spec, "secret")},
        "type": "Opaque",
        "stringData": {"DTRAIN_JOB_SECRET": job_secret or secrets.token_hex(32)},
    }
    selector = {"dtrain.job": spec.name, "dtrain.role": "scheduler" if spec.num_servers
                else "worker"}
    if not spec.num_servers:
        selector["batch.kubernetes.io/job-completion-index"] = "0"
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": spec.rendezvous, "namespace": spec.namespace,
                     "labels": _labels(spec, "rendezvous")},
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": selector,
                 "ports": [{"name": "dtrain", "port": spec.port, "targetPort": spec.port}]},
    }
    if spec.kubeflow:
        return [secret, _kubeflow_job(spec)]
    objects = [secret, service]
    if spec.num_servers:
        objects.append(_job(spec, "scheduler", 1, ["dtrain", "scheduler"], spec.server))
        objects.append(_job(spec, "server", spec.num_servers, ["dtrain", "server"], spec.server))
    objects.append(_job(spec, "worker", spec.num_workers, list(spec.command), spec.worker))
    return objects
