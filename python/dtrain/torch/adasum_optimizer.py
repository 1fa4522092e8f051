"""Horovod's DistributedOptimizer(op=Adasum): each rank takes its own optimizer step and the
ranks combine the changes of the parameters (not the gradients) by Adasum.

As soon as backward has accumulated a parameter's gradient, the wrapped optimizer steps that
parameter alone (its momentum or Adam state stays this rank's own), the change is allreduced with
op=Adasum (ops.py), and step() adds the combined change to the parameter as it was before. Between
backward and step() the parameter holds this rank's change, as in Horovod.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn, overload

import torch

from . import optimizer as _base
from .ops import Adasum, allreduce_async_, synchronize

if TYPE_CHECKING:
    from collections.abc import Callable


class _DistributedAdasumOptimizer(_base._DistributedOptimizer):
    # Only these methods differ: DistributedOptimizer lays them over _DistributedOptimizer's own
    # (names, hooks, zero_grad) when it builds the wrapped optimizer's class.

    def __init__(self, *args: Any) -> None:
        _base._DistributedOptimizer.__init__(self, *args)
        # Each parameter as it was before this rank's step.
        self._starting_models: dict[torch.Tensor, torch.Tensor] = {}

    def _allreduce_grad_async(self, p: torch.Tensor) -> tuple[int, Any]:
        start = self._starting_models.get(p)
        if start is None:
            start = self._starting_models[p] = torch.empty_like(p)
        start.copy_(p.detach())
        # The wrapped optimizer's step, on this parameter only.
        kept = [group["params"] for group in self.param_groups]
        try:
            for group in self.param_groups:
                group["params"] = [q for q in group["params"] if q is p]
            super(self.__class__, self).step()
        finally:
            for group, params in zip(self.param_groups, kept):
                group["params"] = params
        with torch.no_grad():
            p.sub_(start)  # p holds this rank's change until step()
        compressed, ctx = self._compression.compress(p.detach())
        handle = allreduce_async_(compressed, name=self._names[p], op=Adasum,
                                  process_set=self._process_set)
        return handle, ctx

    def synchronize(self) -> None:
        """Nothing to do: step() waits for the changes (Horovod's Adasum optimizer)."""

    def skip_synchronize(self) -> NoReturn:
        raise AssertionError("Skipping synchronization is not supported when using Adasum "
                             "optimizer.")

    @overload  # type: ignore[override, unused-ignore]
    def step(self, closure: None = None) -> None: ...

    @overload
    def step(self, closure: Callable[[], float]) -> float: ...

    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = closure() if closure is not None else None
        # Parameters backward did not reach take part too (every rank submits each of them).
        for p in self._requires_update:
            if self._handles.get(p, (None, None))[0] is None:
                self._handles[p] = self._allreduce_grad_async(p)
        try:
            for p, (handle, ctx) in self._handles.items():
                assert handle is not None  # every one started above
                change = self._compression.decompress(synchronize(handle), ctx)
                start = self._starting_models[p]
                with torch.no_grad():
                    start.add_(change)
                    p.copy_(start)
                self._delay[p] = self.backward_passes_per_step
        finally:
            self._handles.clear()
        _base._count_step()
        return loss
