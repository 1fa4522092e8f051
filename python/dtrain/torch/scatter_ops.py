"""Horovod's alltoall and reducescatter, and the grouped allgather and reducescatter, as
asynchronous calls (``synchronize(handle)`` gives the output). The synchronous, differentiable
forms are in autograd.py.

Both run on host memory: CUDA tensors are copied to the host and their results back to their
GPU. Integer tensors reduce exactly in float64 (up to 2^53), with Horovod's integer average (the
sum scaled, then cast toward zero).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from .. import _dtrain
from ..errors import InvalidArgument
from .ops import (
    Adasum, _check_rows, _grouped, _handle, _initialized, _name, _on_host, _reduce_op,
    _reduction, _rows_for_engine, _submitted_together, allgather_async,
)
from .process_sets import _set_id, _set_size

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

__all__ = [
    "alltoall_async", "reducescatter_async", "grouped_allgather_async",
    "grouped_reducescatter_async",
]


def _splits_list(tensor: torch.Tensor, splits: Sequence[int] | torch.Tensor | None,
                 ranks: int) -> list[int]:
    """Rows of `tensor` for each of `ranks` ranks: `splits` as a list, or an even split of the
    first dimension."""
    rows = tensor.shape[0]
    if splits is None:
        if rows % ranks:
            raise InvalidArgument(
                "alltoall: the first dimension (%d) does not divide among %d ranks; pass splits="
                % (rows, ranks))
        return [rows // ranks] * ranks
    if isinstance(splits, torch.Tensor):
        if splits.dim() != 1 or splits.dtype.is_floating_point or splits.is_complex():
            raise InvalidArgument("alltoall: splits must be a 1-d integer tensor, not %s %s"
                                  % (tuple(splits.shape), splits.dtype))
        return [int(s) for s in splits.cpu().tolist()]
    try:
        return [int(s) for s in splits]
    except (TypeError, ValueError):
        raise InvalidArgument("alltoall: splits must be integers, one per rank, not %r"
                              % (splits,)) from None


def alltoall_async(tensor: torch.Tensor, splits: Sequence[int] | torch.Tensor | None = None,
                   name: str | None = None, process_set: object = None) -> int:
    """Starts sending splits[r] rows (entries of the first dimension) of `tensor`, in order, to
    rank r (an even split when None); synchronize gives (the rows every rank sent this one, in
    rank order; an int32 tensor of how many came from each rank)."""
    _initialized()
    _check_rows("alltoall", tensor)
    pid = _set_id(process_set)
    name = _name("alltoall", name, pid)
    counts = _splits_list(tensor, splits, _set_size(pid))
    work, back = _rows_for_engine(tensor, host_only=True)
    pending = _dtrain.alltoall_async(name, work, counts, pid)
    splits_device = splits.device if isinstance(splits, torch.Tensor) else torch.device("cpu")

    def finish() -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.tensor(pending.received_rows(), dtype=torch.int32, device=splits_device)
        return back(pending.result()), rows

    return _handle(pending, finish, (pid, name))


def reducescatter_async(tensor: torch.Tensor, name: str | None = None, op: int | None = None,
                        process_set: object = None, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0) -> int:
    """Starts reducing `tensor` (the same shape on every rank; Average by default) and keeping
    this rank's rows of the result: the first dimension divided as evenly as can be, the lower
    ranks taking one more row when it does not divide."""
    _initialized()
    if not isinstance(tensor, torch.Tensor):
        raise TypeError("reducescatter takes a tensor, not %s" % type(tensor).__name__)
    if tensor.dim() == 0:
        raise InvalidArgument("reducescatter needs a tensor with at least one dimension (a "
                              "scalar cannot be divided among the ranks)")
    op = _reduce_op(None, op)
    if op == Adasum:
        raise InvalidArgument("reducescatter sums, averages, or takes the min, max or product; "
                              "op=Adasum is for allreduce")
    pid = _set_id(process_set)
    name = _name("reducescatter", name, pid)
    src, engine_op, after = _reduction(tensor, op, prescale_factor, postscale_factor, pid)
    pending = _dtrain.reducescatter_async(name, _on_host(src), engine_op, pid)

    def finish() -> torch.Tensor:
        # The result is memory of its own (the engine's, kept alive by the tensor): no copy.
        return after(pending.result()).to(dtype=tensor.dtype, device=tensor.device)

    return _handle(pending, finish, (pid, name))


def grouped_allgather_async(tensors: Iterable[torch.Tensor], name: str | None = None,
                            process_set: object = None) -> int:
    """Starts an allgather of each tensor, negotiated together; synchronize gives the list."""
    pid = _set_id(process_set)
    base = _name("grouped_allgather", name, pid)
    with _submitted_together(pid):
        return _grouped([allgather_async(t, "%s.%d" % (base, i), process_set)
                         for i, t in enumerate(tensors)])


def grouped_reducescatter_async(tensors: Iterable[torch.Tensor], name: str | None = None,
                                op: int | None = None, process_set: object = None,
                                prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0) -> int:
    """Starts a reducescatter of each tensor, negotiated together; synchronize gives the list."""
    pid = _set_id(process_set)
    base = _name("grouped_reducescatter", name, pid)
    kwargs: dict[str, Any] = {"process_set": process_set, "prescale_factor": prescale_factor,
                              "postscale_factor": postscale_factor}
    with _submitted_together(pid):
        return _grouped([reducescatter_async(t, "%s.%d" % (base, i), op, **kwargs)
                         for i, t in enumerate(tensors)])
