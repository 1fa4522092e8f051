"""dtrain on Kubernetes: ``dtrain launch --launcher kubernetes`` (``python -m dtrain.kubernetes``)
builds a job's objects (dtrain.kubernetes.manifests) from the launcher's options."""

from .manifests import JobSpec, RoleResources, manifests

__all__ = ["JobSpec", "RoleResources", "manifests"]
