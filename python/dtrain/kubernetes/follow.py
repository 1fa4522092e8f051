"""Following a job's pods as the other launchers follow processes: their output merged, each line
prefixed with its member ("[worker 1] "), the first failure named (pod, node, reason: OOMKilled,
Evicted, ImagePullBackOff...), and a verdict: 0 when every member's pod succeeded, otherwise the
failed container's exit code (1 where it has none).

The pods are watched through the API (a label selector on the job's name), in short watches so
that the deadlines are checked between them:
- a failure is collected for ``settle`` seconds before it is named, since its peers notice it and
  exit too: the cause is the first pod that was killed (OOMKilled, Evicted, a signal) or could
  not start (ImagePullBackOff...), else the first that failed;
- with ``max_restarts`` a role's Job replaces a failed pod (its ``backoffLimit``) and dtrain's
  scheduler keeps the rank for it; the job fails when a role has failed more often than that;
- every member's pod must have started within ``start_timeout`` seconds (pods wait for nodes,
  images, quota): otherwise the ones still waiting are named with why they wait;
- a Job's Failed condition ends the job too: its controller also counts pods that end without
  failing here (deleted by a drain or by hand) and then removes the rest.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from typing import Any, TextIO

from .api import REQUEST_TIMEOUT, Cluster, ClusterError
from .manifests import JobSpec
from .pods import PodView, view

__all__ = ["Follower"]

WATCH_SECONDS = 2         # each watch ends after this, to look at the clock
API_FAILURE_LIMIT = 30.0  # the API server unreachable this long (s) ends the job


class Follower:
    def __init__(self, cluster: Cluster, spec: JobSpec, objects: list[dict[str, Any]],
                 out: TextIO = sys.stdout, err: TextIO = sys.stderr, start_timeout: float = 900.0,
                 settle: float = 3.0):
        self.cluster, self.spec, self.out, self.err = cluster, spec, out, err
        # The Jobs (or the Kubeflow job), whose Failed condition ends the job too.
        self.jobs = [o for o in objects if o["kind"] not in ("Secret", "Service")]
        self.job_failure: str | None = None
        self.start_timeout, self.settle = start_timeout, settle
        self.expected = {("worker", r) for r in range(spec.num_workers)}
        if spec.num_servers:
            self.expected |= {("scheduler", 0)} | {("server", r) for r in range(spec.num_servers)}
        self.latest: dict[str, PodView] = {}          # uid -> the pod's latest view
        self.succeeded: set[tuple[str, int]] = set()
        self.started: set[tuple[str, int]] = set()
        self.failures: list[PodView] = []             # in the order seen, one per pod
        self.failures_per_role: Counter[str] = Counter()
        self.first_failure_at: float | None = None
        self.first_failure_index = 0  # failures before it were replaced (--max-restarts)
        # Pods whose log is being read, and pods counted as failed: a watch that starts over
        # replays events, which must not start a second reader or count a failure twice.
        self.reading: set[str] = set()
        self.counted: set[tuple[str, int]] = set()
        self.readers: list[threading.Thread] = []
        self.write_lock = threading.Lock()
        self.finished = False  # drained: the log readers' errors are no news any more

    def say(self, text: str) -> None:
        with self.write_lock:
            print("dtrain launch: " + text, file=self.err, flush=True)

    # --- the pods' output -------------------------------------------------------------------

    def _read_log(self, pod: PodView, container: str) -> None:
        prefix = "[%s %d] " % pod.member
        try:
            response = self.cluster.pod_log(pod.name, container)
            rest = b""
            for chunk in response.stream(amt=None, decode_content=False):
                lines = (rest + chunk).split(b"\n")
                rest = lines.pop()
                self._write(prefix, lines)
            if rest:
                self._write(prefix, [rest])
        except Exception as e:  # a deleted pod ends its stream; nothing may escape this thread
            status = getattr(e.__cause__, "status", None)
            if not self.finished and status != 404:  # 404: deleted before its log was read
                self.say("the output of %s %d (pod %s) ended: %s" % (pod.role, pod.rank,
                                                                     pod.name, e))

    def _write(self, prefix: str, lines: list[bytes]) -> None:
        if not lines:
            return
        text = "".join(prefix + line.decode("utf-8", "replace") + "\n" for line in lines)
        with self.write_lock:
            self.out.write(text)
            self.out.flush()

    def _container_of(self, pod: Any) -> str:
        containers = pod.spec.containers if pod.spec else []
        return containers[0].name if containers else ""

    # --- what the pods say ------------------------------------------------------------------

    def on_pod(self, kind: str, pod: Any) -> None:
        v = view(pod, deleted=kind == "DELETED")
        if v is None or v.member not in self.expected:
            return
        before = self.latest.get(v.uid)
        self.latest[v.uid] = v
        if v.started and v.uid not in self.reading:
            self.reading.add(v.uid)
            self.started.add(v.member)
            reader = threading.Thread(target=self._read_log, args=(v, self._container_of(pod)),
                                      name="log " + v.name, daemon=True)
            reader.start()
            self.readers.append(reader)
        if v.phase == "Succeeded":
            self.succeeded.add(v.member)
        failure = (v.uid, self._restarts(pod))
        if v.failed and (before is None or not before.failed) and failure not in self.counted:
            self.counted.add(failure)
            self._on_failure(v)

    @staticmethod
    def _restarts(pod: Any) -> int:
        """The container's restarts: under Kubeflow with --max-restarts a pod restarts its
        container in place (restartPolicy OnFailure), and each failure counts."""
        statuses = (pod.status.container_statuses if pod.status else None) or []
        return sum(c.restart_count or 0 for c in statuses)

    def _on_failure(self, v: PodView) -> None:
        self.failures.append(v)
        self.failures_per_role[v.role] += 1
        used = self.failures_per_role[v.role]
        if used <= self.spec.max_restarts and not v.reason.startswith(("ImagePull", "ErrImage",
                                                                       "InvalidImage",
                                                                       "CreateContainer")):
            self.say("%s; %s (restart %d of %d)" % (
                v.describe(), "the operator restarts it" if self.spec.kubeflow
                else "its Job starts another pod for it", used, self.spec.max_restarts))
            return
        if self.first_failure_at is None:
            self.first_failure_at = time.monotonic()
            self.first_failure_index = len(self.failures) - 1

    # --- the verdict ------------------------------------------------------------------------

    def cause(self) -> PodView:
        recent = self.failures[self.first_failure_index:]
        failing = [f for f in recent if f.killed] or recent
        return failing[0]

    def check_jobs(self) -> None:
        """A Failed condition on a Job ends the job (with the pod that failed, if seen)."""
        for obj in self.jobs:
            try:
                why = self.cluster.failure(obj)
            except ClusterError as e:
                if e.status != 404:
                    raise
                why = "%s %s was deleted" % (obj["kind"], obj["metadata"]["name"])
            if why and self.job_failure is None:
                self.job_failure = why

    def verdict(self, now: float, started_at: float) -> int | None:
        if self.first_failure_at is None and self.job_failure is not None:
            self.say(self.job_failure + "; stopping the job")
            return 1
        if self.first_failure_at is not None:
            if now - self.first_failure_at < self.settle:
                return None
            cause = self.cause()
            self.say("%s; stopping the job" % cause.describe())
            others = [f.describe() for f in self.failures if f is not cause]
            if others:
                self.say("also failed: " + "; ".join(others))
            code = cause.exit_code
            return code if code is not None and 0 < code < 256 else 1
        if self.succeeded >= self.expected:
            return 0
        if now - started_at > self.start_timeout and not self.started >= self.expected:
            waiting = sorted(self.expected - self.started)
            pods = {v.member: v for v in self.latest.values() if not v.deleted}
            described = ["%s %d (%s)" % (m[0], m[1], "pod %s: %s" % (
                pods[m].name, pods[m].pending_reason()) if m in pods else "no pod yet")
                for m in waiting]
            self.say("not started within %g s (--start-timeout): %s; stopping the job" % (
                self.start_timeout, "; ".join(described)))
            return 1
        return None

    def run(self) -> int:
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        started_at = time.monotonic()
        resource_version: str | None = None
        unreachable_since: float | None = None
        selector = "dtrain.job=" + self.spec.name
        while True:
            w = watch.Watch()
            try:
                for event in w.stream(self.cluster.core.list_namespaced_pod,
                                      self.cluster.namespace, label_selector=selector,
                                      resource_version=resource_version,
                                      timeout_seconds=WATCH_SECONDS,
                                      _request_timeout=REQUEST_TIMEOUT):
                    self.on_pod(event["type"], event["object"])
                    if self.first_failure_at is None and self.succeeded >= self.expected:
                        break
                resource_version = w.resource_version
                if self.first_failure_at is None and not self.succeeded >= self.expected:
                    self.check_jobs()
                unreachable_since = None
            except ApiException as e:
                if e.status == 410:  # too old to resume from: start over from the current pods
                    resource_version = None
                else:
                    raise ClusterError("watching the pods: the API server at %s answered %s %s"
                                       % (self.cluster.server, e.status, e.reason)) from e
            except Exception as e:  # connection refused, reset, timed out; a status refused
                now = time.monotonic()
                unreachable_since = unreachable_since or now
                if now - unreachable_since > API_FAILURE_LIMIT:
                    raise ClusterError("following the job: the API server at %s has failed "
                                       "every request for %g s: %s" % (
                                           self.cluster.server, API_FAILURE_LIMIT, e)) from e
                time.sleep(1)
            code = self.verdict(time.monotonic(), started_at)
            if code is not None:
                return code

    def drain(self, seconds: float = 5.0) -> None:
        """Lets the pods' last lines arrive (their streams end with the containers)."""
        deadline = time.monotonic() + seconds
        for reader in self.readers:
            reader.join(max(0.0, deadline - time.monotonic()))
        self.finished = True
