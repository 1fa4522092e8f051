"""Creating and deleting a job's objects through the Kubernetes API, with the official client
library (PyPI's ``kubernetes``, Debian's python3-kubernetes): the cluster is the one kubectl would
use (``KUBECONFIG`` or ~/.kube/config), or, inside a pod, the pod's own service account."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["Cluster", "ClusterError"]

REQUEST_TIMEOUT = (10, 30)  # connect, read (s): a call never waits for an unreachable server
LOG_READ_TIMEOUT = 86400    # s between two pieces of a followed log


class ClusterError(RuntimeError):
    """The API server could not be reached, or refused a request: the message names which.
    `status` is the server's HTTP status when it answered (409: the name is taken), else None."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


def _plural(kind: str) -> str:
    return kind.lower() + "s"  # Secret, Service, Job, MXJob, PyTorchJob


class Cluster:
    """The API calls the launcher makes, each with a deadline."""

    def __init__(self, namespace: str):
        try:
            from kubernetes import client, config
        except ImportError as e:
            raise ClusterError("the kubernetes launcher needs Kubernetes' Python client: "
                               "pip install 'dtrain[kubernetes]' (or apt install "
                               "python3-kubernetes); --dry-run prints the manifests without it") \
                from e
        try:
            if os.environ.get("KUBERNETES_SERVICE_HOST") and not os.environ.get("KUBECONFIG"):
                config.load_incluster_config()
            else:
                config.load_kube_config()
        except Exception as e:  # the client raises ConfigException, or OSError for a bad file
            raise ClusterError("no Kubernetes cluster configured (KUBECONFIG, ~/.kube/config or "
                               "a pod's service account): %s" % e) from e
        self.namespace = namespace
        self.api = client.ApiClient()
        self.server = self.api.configuration.host
        self.core = client.CoreV1Api(self.api)
        self.batch = client.BatchV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self._exception = client.exceptions.ApiException
        # Jobs go with their pods, without waiting for them to go first.
        self._delete_options = client.V1DeleteOptions(propagation_policy="Background")

    def _call(self, what: str, fn: Any, *args: Any, timeout: Any = REQUEST_TIMEOUT,
              **kwargs: Any) -> Any:
        try:
            return fn(*args, _request_timeout=timeout, **kwargs)
        except self._exception as e:
            body = e.body.decode("utf-8", "replace") if isinstance(e.body, bytes) else e.body
            raise ClusterError("%s: the API server at %s answered %s %s: %s" % (
                what, self.server, e.status, e.reason, (body or "").strip()[:500]),
                status=e.status) from e
        except Exception as e:  # urllib3's connection errors, timeouts
            raise ClusterError("%s: cannot reach the API server at %s: %s" % (
                what, self.server, e)) from e

    def create(self, obj: dict[str, Any]) -> None:
        kind, ns = obj["kind"], self.namespace
        what = "creating %s %s/%s" % (kind, ns, obj["metadata"]["name"])
        if kind == "Secret":
            self._call(what, self.core.create_namespaced_secret, ns, obj)
        elif kind == "Service":
            self._call(what, self.core.create_namespaced_service, ns, obj)
        elif kind == "Job":
            self._call(what, self.batch.create_namespaced_job, ns, obj)
        else:  # Kubeflow's MXJob, PyTorchJob
            group, version = obj["apiVersion"].split("/")
            self._call(what, self.custom.create_namespaced_custom_object, group, version, ns,
                       _plural(kind), obj)

    def delete(self, obj: dict[str, Any]) -> str | None:
        """Deletes it with what it owns (a Job's pods); None when done or already gone, else
        why not."""
        kind, ns, name = obj["kind"], self.namespace, obj["metadata"]["name"]
        what = "deleting %s %s/%s" % (kind, ns, name)
        options = self._delete_options
        try:
            if kind == "Secret":
                self._call(what, self.core.delete_namespaced_secret, name, ns, body=options)
            elif kind == "Service":
                self._call(what, self.core.delete_namespaced_service, name, ns, body=options)
            elif kind == "Job":
                self._call(what, self.batch.delete_namespaced_job, name, ns, body=options)
            else:
                group, version = obj["apiVersion"].split("/")
                self._call(what, self.custom.delete_namespaced_custom_object, group, version, ns,
                           _plural(kind), name, body=options)
        except ClusterError as e:
            return None if e.status == 404 else str(e)
        return None

    def failure(self, obj: dict[str, Any]) -> str | None:
        """Why a Job (or Kubeflow job) has failed, from its Failed condition; None while it has
        not. The controller decides that from pods the launcher may never see fail: a pod deleted
        by a node's drain or by hand counts against the backoff limit too."""
        kind, ns, name = obj["kind"], self.namespace, obj["metadata"]["name"]
        what = "reading the status of %s %s/%s" % (kind, ns, name)
        conditions: list[tuple[str, str, str, str]] = []
        if kind == "Job":
            job = self._call(what, self.batch.read_namespaced_job_status, name, ns)
            for c in (job.status.conditions if job.status else None) or []:
                conditions.append((c.type, c.status, c.reason or "", c.message or ""))
        elif kind not in ("Secret", "Service"):
            group, version = obj["apiVersion"].split("/")
            found = self._call(what, self.custom.get_namespaced_custom_object, group, version, ns,
                               _plural(kind), name)
            for c in (found.get("status") or {}).get("conditions") or []:
                conditions.append((c.get("type", ""), c.get("status", ""), c.get("reason", ""),
                                   c.get("message", "")))
        for kind_of, status, reason, message in conditions:
            if kind_of == "Failed" and status == "True":
                return "%s %s failed: %s%s" % (kind, name, reason or "Failed",
                                                ": " + message if message else "")
        return None

    def pod_log(self, pod: str, container: str) -> Any:
        """The container's output as it comes (a urllib3 response to read until it ends). A day
        to read: a quiet container sends nothing for as long as it likes, and the readers are
        daemon threads that the job's end does not wait for long. (Not None: the client's newer
        versions accept only numbers.)"""
        return self._call("reading the log of pod %s" % pod, self.core.read_namespaced_pod_log,
                          pod, self.namespace, timeout=(REQUEST_TIMEOUT[0], LOG_READ_TIMEOUT),
                          container=container, follow=True, _preload_content=False)
