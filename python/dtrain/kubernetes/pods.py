"""What a job's pod says about its member, read from the pod objects the Kubernetes API returns
(the official client's ``V1Pod``): whose pod it is (role and rank), whether its container has
started, finished or failed, and why.

A pod's rank is its Indexed Job's completion index (``--launcher kubernetes``), or, under
Kubeflow's training operator (``--kubeflow``), its replica index (a PyTorchJob's Master is rank 0
and its Worker i rank i+1). The role is the ``dtrain.role`` label every pod template carries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .manifests import RANK_OFFSET

__all__ = ["PodView", "view", "FATAL_WAITING"]

INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
REPLICA_INDEX = "training.kubeflow.org/replica-index"

# Reasons a container waits that do not go away by themselves: waiting would only end at the start
# deadline, so they fail the job at once. (ErrImagePull turns into ImagePullBackOff within seconds
# when it persists; a single failed pull that then succeeds never fails the job.)
FATAL_WAITING = frozenset({"ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName",
                           "CreateContainerConfigError", "CreateContainerError"})


@dataclass(frozen=True)
class PodView:
    name: str
    uid: str
    role: str
    rank: int
    node: str          # "" while unscheduled
    phase: str         # Pending, Running, Succeeded, Failed, Unknown
    started: bool      # its container runs or has run: it has logs
    failed: bool       # it will not succeed: failed, evicted or stuck (FATAL_WAITING)
    exit_code: int | None
    reason: str        # OOMKilled, Evicted, Error, ImagePullBackOff...; "" if none
    message: str
    deleted: bool = False

    @property
    def member(self) -> tuple[str, int]:
        return self.role, self.rank

    @property
    def killed(self) -> bool:
        """Ended by something other than its own exit: the likelier cause when peers fail too."""
        return (self.reason in ("OOMKilled", "Evicted") or self.reason in FATAL_WAITING
                or (self.exit_code is not None and self.exit_code >= 128))

    def describe(self) -> str:
        """ "worker 1 (pod demo-worker-1-x7k2p on node-a): OOMKilled, exit code 137" """
        where = "pod %s%s" % (self.name, " on " + self.node if self.node else "")
        what = self.reason or "failed"
        if self.exit_code is not None:
            what += ", exit code %d" % self.exit_code
        if self.message:
            what += ": " + self.message.strip()
        return "%s %d (%s): %s" % (self.role, self.rank, where, what)

    def pending_reason(self) -> str:
        """Why it has not started, for the start deadline's message."""
        return self.reason + (": " + self.message if self.message else "") if self.reason \
            else self.phase.lower()


def _rank(labels: dict[str, str], annotations: dict[str, str]) -> int | None:
    index = annotations.get(INDEX_ANNOTATION, labels.get(INDEX_ANNOTATION))
    if index is not None:
        return int(index)
    if REPLICA_INDEX in labels:
        # A PyTorchJob's Master is rank 0: its Workers' template says to count after it.
        return int(labels[REPLICA_INDEX]) + int(labels.get(RANK_OFFSET, "0"))
    return None


def view(pod: Any, deleted: bool = False) -> PodView | None:
    """The member a pod runs, or None for a pod that is not one of the job's members."""
    meta, status = pod.metadata, pod.status
    labels = dict(meta.labels or {})
    role = labels.get("dtrain.role")
    try:
        rank = _rank(labels, dict(meta.annotations or {}))
    except ValueError:
        rank = None
    if role not in ("scheduler", "server", "worker") or rank is None:
        return None
    phase = (status.phase if status else None) or "Pending"
    node = (pod.spec.node_name if pod.spec else None) or ""
    # A pod being deleted (by the Job controller once the Job has failed, or by us) stops because
    # of that: its end is nobody's failure.
    terminating = meta.deletion_timestamp is not None
    started, failed = False, phase == "Failed" and not terminating
    exit_code: int | None = None
    reason = (status.reason if status else None) or ""        # Evicted, DeadlineExceeded...
    message = (status.message if status else None) or ""
    for c in (status.container_statuses or []) if status else []:
        state = c.state
        if state is None:
            continue
        if state.running is not None:
            started = True
        elif state.terminated is not None:
            started = True
            exit_code = state.terminated.exit_code
            if state.terminated.exit_code != 0 and not terminating:
                failed = True
                reason = reason or state.terminated.reason or "Error"
                message = message or state.terminated.message or ""
        elif state.waiting is not None and state.waiting.reason:
            if state.waiting.reason in FATAL_WAITING and not terminating:
                failed = True
            if not reason:
                reason, message = state.waiting.reason, state.waiting.message or ""
    if not reason and phase == "Pending" and status is not None:
        for cond in status.conditions or []:
            if cond.type == "PodScheduled" and cond.status == "False":
                reason, message = cond.reason or "Unschedulable", cond.message or ""
    return PodView(name=meta.name, uid=meta.uid or meta.name, role=role, rank=rank, node=node,
                   phase=phase, started=started, failed=failed, exit_code=exit_code,
                   reason=reason, message=message, deleted=deleted)
