"""A stand-in for a Kubernetes API server and its nodes, on loopback, for test_kubernetes_api.py:
the launcher under test talks to it with Kubernetes' official Python client, unchanged (a
kubeconfig with a bearer token, real HTTP, watches as chunked streams of JSON events, followed
logs), and the pods it creates run as real processes.

What it does as Kubernetes does: Secrets, Services, Indexed Jobs (one pod per completion index,
the index as the pod's annotation and label, restartPolicy Never, a failed pod replaced until the
Job's backoffLimit, then the Job failed and its other pods removed), deletion with the Job's pods,
409 for a name taken, 404 for one unknown, 401 without the token; the pods' environment from the
Secret (secretKeyRef) and from their own fields (status.podIP, the completion index); their
output as their log; a pod killed with SIGKILL under a memory limit reported OOMKilled (exit code
137) as the kubelet reports a cgroup's OOM kill; an image named "*unpullable*" left waiting in
ImagePullBackOff; a pod asking for more than a node's 16 CPUs left Pending, Unschedulable; evict()
as the kubelet's eviction (the container killed, the pod Failed with reason Evicted);
delete_pod() as `kubectl delete pod` or a node's drain (counted against the Job's backoffLimit,
as the Job controller counts it); a Job's status with its Failed condition.

What it does not: scheduling onto real nodes (every pod runs on this machine, its IP 127.0.0.1, and
the Services' names resolve to it through a hosts file bind-mounted into each pod's own mount
namespace, where the tests may do that), images (a pod runs its command with this machine's
programs), admission and validation (test_kubernetes.py checks the manifests against Kubernetes'
schemas), the Job controller's backoff delays, and Kubeflow's operator (an MXJob is stored, and
nothing runs it).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import secrets
import signal
import subprocess
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

INDEX = "batch.kubernetes.io/job-completion-index"
NODE_CPUS = 16
NODES = ("node-a", "node-b")
ROUTE = re.compile(r"^/(?:api/v1|apis/(?P<group>[^/]+)/(?P<version>[^/]+))/namespaces/(?P<ns>[^/]+)"
                   r"/(?P<plural>[a-z]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>log|status))?$")


def _cpus(quantity: str | None) -> float:
    if not quantity:
        return 0.0
    return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


class Pod:
    def __init__(self, server: "StandIn", job: dict, index: int):
        self.server, self.job, self.index = server, job, index
        template = job["spec"]["template"]
        suffix = secrets.token_hex(3)[:5]
        self.name = "%s-%d-%s" % (job["metadata"]["name"], index, suffix)
        self.container = dict(template["spec"]["containers"][0])
        labels = dict(template["metadata"].get("labels", {}))
        labels.update({INDEX: str(index), "job-name": job["metadata"]["name"]})
        self.obj = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": self.name, "namespace": job["metadata"]["namespace"],
                         "uid": secrets.token_hex(8), "labels": labels,
                         "annotations": {INDEX: str(index)}},
            "spec": {"containers": [self.container],
                     "restartPolicy": template["spec"].get("restartPolicy", "Always")},
            "status": {"phase": "Pending"},
        }
        self.log = tempfile.NamedTemporaryFile(prefix=self.name + ".", suffix=".log",
                                               dir=server.workdir, delete=False)
        self.process: subprocess.Popen | None = None
        self.ended = threading.Event()
        self.evicted = False
        self.removing = False  # deleted: its end is no status of its own

    # --- status as the kubelet reports it ---

    def _container_status(self, state: dict) -> dict:
        return {"name": self.container["name"], "image": self.container["image"], "imageID": "",
                "ready": "running" in state, "restartCount": 0, "state": state}

    def set_status(self, **status) -> None:
        with self.server.lock:  # the watches copy the object under the lock
            self.obj["status"].update(status)
            self.server.publish("MODIFIED", self)

    def start(self) -> None:
        limits = self.container.get("resources", {}).get("limits", {})
        if _cpus(limits.get("cpu")) > NODE_CPUS:
            self.set_status(conditions=[{
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": "0/%d nodes are available: %d Insufficient cpu." % (len(NODES),
                                                                               len(NODES))}])
            return
        self.obj["spec"]["nodeName"] = NODES[self.index % len(NODES)]
        if "unpullable" in self.container["image"]:
            waiting = {"reason": "ImagePullBackOff",
                       "message": 'Back-off pulling image "%s"' % self.container["image"]}
            self.set_status(containerStatuses=[self._container_status({"waiting": waiting})])
            return
        env = dict(self.server.image_env)
        for e in self.container.get("env", []):
            env[e["name"]] = self._value(e)
        command = list(self.container.get("command", [])) + list(self.container.get("args", []))
        wrapper = self.server.hosts_wrapper()
        self.process = subprocess.Popen(wrapper + command, env=env, stdout=self.log,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True)
        self.set_status(phase="Running", podIP="127.0.0.1", containerStatuses=[
            self._container_status({"running": {"startedAt": _now()}})])
        threading.Thread(target=self._wait, daemon=True).start()

    def _value(self, e: dict) -> str:
        if "value" in e:
            return e["value"]
        source = e["valueFrom"]
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            secret = self.server.objects[("secrets", ref["name"])]
            return secret.get("stringData", {})[ref["key"]]
        path = source["fieldRef"]["fieldPath"]
        if path == "status.podIP":
            return "127.0.0.1"
        if INDEX in path:
            return str(self.index)
        raise ValueError("the stand-in has no field %s" % path)

    def _wait(self) -> None:
        assert self.process is not None
        code = self.process.wait()
        memory_limited = "memory" in self.container.get("resources", {}).get("limits", {})
        if self.evicted:
            terminated = {"exitCode": 137, "reason": "Error"}
            status = {"phase": "Failed", "reason": "Evicted",
                      "message": "The node was low on resource: memory."}
        elif code == -signal.SIGKILL and memory_limited:
            terminated = {"exitCode": 137, "reason": "OOMKilled"}
            status = {"phase": "Failed"}
        else:
            exit_code = code if code >= 0 else 128 - code
            terminated = {"exitCode": exit_code, "reason": "Completed" if code == 0 else "Error"}
            status = {"phase": "Succeeded" if code == 0 else "Failed"}
        terminated["finishedAt"] = _now()
        self.log.flush()
        self.ended.set()
        if self.removing:
            return
        self.set_status(containerStatuses=[self._container_status({"terminated": terminated})],
                        **status)
        if status["phase"] == "Failed":
            self.server.pod_failed(self)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.ended.set()


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class StandIn:
    """The API server (``url``, ``token``) with ``pods`` running under it."""

    def __init__(self, workdir: str, image_env: dict[str, str], hosts: dict[str, str] | None = None):
        self.workdir, self.image_env, self.hosts = workdir, image_env, hosts
        self.token = secrets.token_hex(16)
        self.lock = threading.Condition()
        self.objects: dict[tuple[str, str], dict] = {}   # (plural, name) -> object
        self.pods: dict[str, Pod] = {}
        self.events: list[tuple[int, str, dict]] = []   # (resourceVersion, type, pod snapshot)
        self.rv = itertools.count(1)
        self.requests: list[tuple[str, str]] = []
        self.unauthorized = 0
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.httpd.daemon_threads = True
        self.url = "http://127.0.0.1:%d" % self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def kubeconfig(self, path: str) -> str:
        config = {"apiVersion": "v1", "kind": "Config", "current-context": "standin",
                  "clusters": [{"name": "standin", "cluster": {"server": self.url}}],
                  "users": [{"name": "tester", "user": {"token": self.token}}],
                  "contexts": [{"name": "standin", "context": {"cluster": "standin",
                                                               "user": "tester"}}]}
        with open(path, "w") as f:
            json.dump(config, f)  # YAML's superset: the client reads it as kubectl would
        return path

    def hosts_wrapper(self) -> list[str]:
        """The command prefix that gives a pod the cluster's names (as its DNS would)."""
        if not self.hosts:
            return []
        path = os.path.join(self.workdir, "hosts")
        if not os.path.exists(path):
            with open(path, "w") as f:
                f.write("127.0.0.1 localhost\n")
                f.writelines("%s %s\n" % (ip, name) for name, ip in self.hosts.items())
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                'mount --bind "$0" /etc/hosts && exec "$@"', path]

    def close(self) -> None:
        self.httpd.shutdown()
        for pod in list(self.pods.values()):
            pod.kill()

    # --- what the tests look at ---

    def pod(self, role: str, rank: int, timeout: float = 60) -> Pod:
        """The running pod of that member, once it runs."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                for p in self.pods.values():
                    labels = p.obj["metadata"]["labels"]
                    if labels.get("dtrain.role") == role and p.index == rank and \
                            p.obj["status"]["phase"] == "Running":
                        return p
            time.sleep(0.05)
        raise AssertionError("no running pod of %s %d within %g s" % (role, rank, timeout))

    def evict(self, pod: Pod) -> None:
        pod.evicted = True
        pod.kill()

    def running_processes(self) -> list[str]:
        return [p.name for p in self.pods.values()
                if p.process is not None and p.process.poll() is None]

    # --- the controllers ---

    def publish(self, kind: str, pod: Pod) -> None:
        with self.lock:
            rv = next(self.rv)
            pod.obj["metadata"]["resourceVersion"] = str(rv)
            self.events.append((rv, kind, json.loads(json.dumps(pod.obj))))
            self.lock.notify_all()

    def create(self, plural: str, obj: dict) -> dict:
        obj.setdefault("metadata", {}).update(uid=secrets.token_hex(8),
                                               resourceVersion=str(next(self.rv)),
                                               creationTimestamp=_now())
        self.objects[(plural, obj["metadata"]["name"])] = obj
        if plural == "jobs":
            obj["status"] = {"failed": 0}
            for index in range(obj["spec"]["completions"]):
                self._new_pod(obj, index)
        return obj

    def _new_pod(self, job: dict, index: int) -> None:
        pod = Pod(self, job, index)
        with self.lock:
            self.pods[pod.name] = pod
        self.publish("ADDED", pod)
        pod.start()

    def pod_failed(self, pod: Pod, deleted: bool = False) -> None:
        job = pod.job
        with self.lock:
            if ("jobs", job["metadata"]["name"]) not in self.objects or \
                    (pod.name not in self.pods and not deleted):
                return
            job["status"]["failed"] += 1
            replace = job["status"]["failed"] <= job["spec"].get("backoffLimit", 6)
        if replace:
            self._new_pod(job, pod.index)
            return
        with self.lock:
            job["status"]["conditions"] = [{
                "type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                "message": "Job has reached the specified backoff limit"}]
        self._remove_pods(job, keep_failed=True)

    def _remove_pods(self, job: dict, keep_failed: bool = False) -> None:
        with self.lock:
            pods = [p for p in self.pods.values() if p.job is job]
        for p in pods:
            if keep_failed and p.obj["status"]["phase"] in ("Failed", "Succeeded"):
                continue
            self._delete_pod(p)

    def _delete_pod(self, p: Pod) -> None:
        # As the API server deletes gracefully: the pod is marked, then stopped, then gone.
        with self.lock:
            p.removing = True
            p.obj["metadata"]["deletionTimestamp"] = _now()
            self.publish("MODIFIED", p)
        p.kill()
        with self.lock:
            self.pods.pop(p.name, None)
            self.publish("DELETED", p)

    def delete_pod(self, pod: Pod) -> None:
        """`kubectl delete pod` (or a node's drain): the Job controller counts the pod as failed
        and, past its backoffLimit, fails the Job and removes its other pods."""
        self._delete_pod(pod)
        self.pod_failed(pod, deleted=True)

    def delete(self, plural: str, name: str) -> dict | None:
        with self.lock:
            obj = self.objects.pop((plural, name), None)
        if obj is not None and plural == "jobs":
            self._remove_pods(obj)
        return obj


def _handler(standin: StandIn) -> type:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def _send(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _status(self, code: int, reason: str, message: str) -> None:
            self._send(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                              "reason": reason, "message": message, "code": code})

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        def _start_stream(self, content_type: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

        def _route(self):
            url = urlparse(self.path)
            standin.requests.append((self.command, url.path))
            if self.headers.get("Authorization") != "Bearer " + standin.token:
                standin.unauthorized += 1
                self._status(401, "Unauthorized", "Unauthorized")
                return None
            m = ROUTE.match(url.path)
            if not m:
                self._status(404, "NotFound", "no route %s" % url.path)
                return None
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            return m, query

        def do_POST(self) -> None:
            routed = self._route()
            if routed is None:
                return
            m, _ = routed
            obj = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            plural, name = m["plural"], obj["metadata"]["name"]
            if (plural, name) in standin.objects:
                self._status(409, "AlreadyExists", '%s "%s" already exists' % (plural, name))
                return
            self._send(201, standin.create(plural, obj))

        def do_DELETE(self) -> None:
            routed = self._route()
            if routed is None:
                return
            m, _ = routed
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            obj = standin.delete(m["plural"], m["name"])
            if obj is None:
                self._status(404, "NotFound", '%s "%s" not found' % (m["plural"], m["name"]))
            else:
                self._send(200, obj)

        def do_GET(self) -> None:
            routed = self._route()
            if routed is None:
                return
            m, query = routed
            if m["plural"] == "pods" and m["sub"] == "log":
                self._log(m["name"], query)
            elif m["name"] and m["plural"] != "pods" and m["sub"] in (None, "status"):
                with standin.lock:  # an object as stored, with its status
                    found = standin.objects.get((m["plural"], m["name"]))
                    body = json.loads(json.dumps(found)) if found else None
                if body is None:
                    self._status(404, "NotFound", '%s "%s" not found' % (m["plural"], m["name"]))
                else:
                    self._send(200, body)
            elif m["plural"] == "pods" and query.get("watch", "").lower() in ("true", "1"):
                self._watch(query)
            else:
                self._status(404, "NotFound", "the stand-in serves no pod lists but watches")

        def _watch(self, query: dict) -> None:
            selector = dict(kv.split("=", 1) for kv in query.get("labelSelector", "").split(",")
                            if kv)

            def matches(pod: dict) -> bool:
                labels = pod["metadata"].get("labels", {})
                return all(labels.get(k) == v for k, v in selector.items())

            deadline = time.monotonic() + float(query.get("timeoutSeconds", 30))
            self._start_stream("application/json")
            with standin.lock:
                if "resourceVersion" in query:
                    after = int(query["resourceVersion"])
                    pending = []
                else:  # the current pods first, as ADDED
                    after = max([rv for rv, _, _ in standin.events], default=0)
                    pending = [("ADDED", json.loads(json.dumps(p.obj)))
                               for p in standin.pods.values()]
            try:
                while True:
                    for kind, pod in pending:
                        if matches(pod):
                            self._chunk(json.dumps({"type": kind, "object": pod}).encode()
                                        + b"\n")
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    with standin.lock:
                        standin.lock.wait_for(lambda: standin.events[-1][0] > after
                                              if standin.events else False, timeout=left)
                        pending = [(k, p) for rv, k, p in standin.events if rv > after]
                        after = max([after] + [rv for rv, _, _ in standin.events])
                self._chunk(b"")
            except (BrokenPipeError, ConnectionResetError):
                pass

        def _log(self, name: str, query: dict) -> None:
            pod = standin.pods.get(name)
            if pod is None:
                self._status(404, "NotFound", 'pods "%s" not found' % name)
                return
            self._start_stream("text/plain")
            try:
                with open(pod.log.name, "rb") as f:
                    while True:
                        data = f.read(65536)
                        if data:
                            self._chunk(data)
                        elif pod.ended.is_set() or query.get("follow", "").lower() != "true":
                            rest = f.read()
                            if rest:
                                self._chunk(rest)
                            break
                        else:
                            time.sleep(0.05)
                self._chunk(b"")
            except (BrokenPipeError, ConnectionResetError):
                pass

    return Handler
