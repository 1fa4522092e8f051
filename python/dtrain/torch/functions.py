"""Horovod's helpers for starting every rank from the same model and optimizer state."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from .ops import broadcast_async_, broadcast_object, rank, synchronize
from .optimizer import _DistributedOptimizer

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["broadcast_parameters", "broadcast_optimizer_state"]


def broadcast_parameters(params: dict[str, Any] | Iterable[tuple[str, torch.Tensor | None]],
                         root_rank: int) -> None:
    """Copies root's parameters into every rank's, in place. `params` is a ``state_dict()``, a
    ``named_parameters()`` iterator, or a list of (name, tensor) pairs; names must be the same
    on every rank."""
    if isinstance(params, dict):
        items: list[tuple[str, Any]] = sorted(params.items())
    else:
        items = list(params)
        if items and not all(isinstance(p, tuple) and len(p) == 2 for p in items):
            raise ValueError("broadcast_parameters takes a state_dict or (name, tensor) pairs, "
                             "e.g. model.named_parameters()")
    handles: list[int] = []
    with torch.no_grad():
        for name, p in items:
            if p is None or not isinstance(p, torch.Tensor):
                continue
            handles.append(broadcast_async_(p, root_rank, "broadcast.param." + str(name)))
        for h in handles:
            synchronize(h)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int,
                              model: torch.nn.Module | None = None) -> None:
    """Copies root's optimizer state (and hyper-parameters) into every rank's optimizer.

    As Horovod's: an optimizer that has not stepped yet first makes its state with one step on
    zero gradients (every parameter that requires one gets a zero .grad, sparse for SparseAdam
    and for a sparse embedding of `model` under SGD), so that every rank holds the same state
    afterwards. That step is the wrapped optimizer's own: a DistributedOptimizer does not
    allreduce in it."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError("broadcast_optimizer_state takes a torch.optim.Optimizer")
    if not optimizer.state_dict()["state"]:
        _make_state(optimizer, model)
    state = broadcast_object(optimizer.state_dict(), root_rank, "broadcast.optimizer_state")
    if rank() != root_rank:
        optimizer.load_state_dict(state)


def _make_state(optimizer: torch.optim.Optimizer, model: torch.nn.Module | None) -> None:
    sparse: set[int] = set()
    if model is not None:
        for m in model.modules():
            if isinstance(m, torch.nn.Embedding) and m.sparse:
                sparse.update(id(p) for p in m.parameters())
    for group in optimizer.param_groups:
        for p in group["params"]:
            if not p.requires_grad:
                continue
            p.grad = torch.zeros_like(p)
            if isinstance(optimizer, torch.optim.SparseAdam) or \
                    (isinstance(optimizer, torch.optim.SGD) and id(p) in sparse):
                p.grad = p.grad.to_sparse()
    if type(optimizer).__module__ == _DistributedOptimizer.__module__:
        # The wrapped optimizer's step (the class DistributedOptimizer derived from): no allreduce.
        getattr(super(type(optimizer), optimizer), "step")()
    else:
        optimizer.step()
