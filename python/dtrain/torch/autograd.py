"""The synchronous collectives of Horovod's API, differentiable as Horovod's are: a tensor that
requires grad gets gradients back through allreduce, allgather, broadcast, alltoall,
reducescatter and their grouped forms (e.g. a contrastive loss over allgathered embeddings).

Gradients follow Horovod's definitions, which treat the loss as the average over ranks:
  allreduce      the gradient allreduced with the same op and scale factors (Sum and Average;
                 Min, Max and Product have no gradient here, and say so)
  allgather      the gradient averaged over ranks, this rank's rows of it
  broadcast      the gradient averaged over ranks on the root, zeros elsewhere
  alltoall       the gradient sent back where its rows came from
  reducescatter  every rank's gradient gathered, times the number of ranks for Sum
The backward collectives are named after the forward's name (".grad"), or numbered like unnamed
ones: every rank must run the same backward, as it runs the same forward. With a process set, the
backward collectives run in the same set, and "ranks" above are its members.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from .compression import Compression
from .ops import (
    Adasum, Average, Sum, _reduce_op, allgather_async, allreduce_async, broadcast_async,
    grouped_allreduce_async, rank, synchronize,
)
from .process_sets import _set_id, _set_rank, _set_size
from .scatter_ops import (
    alltoall_async, grouped_allgather_async, grouped_reducescatter_async, reducescatter_async,
)

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from .compression import Compressor

__all__ = [
    "allreduce", "grouped_allreduce", "allgather", "grouped_allgather", "broadcast", "alltoall",
    "reducescatter", "grouped_reducescatter",
]


def _grad_name(name: str | None, suffix: str = "grad") -> str | None:
    return None if name is None else "%s.%s" % (name, suffix)


# Horovod's backward of an allreduce is the same allreduce of the gradients (for Adasum too).
_OPS_WITH_GRADIENTS = (Average, Sum, Adasum)


def _allreduce_grad(grad: torch.Tensor, name: str | None, op: int, prescale_factor: float,
                    postscale_factor: float, ps: Any) -> torch.Tensor:
    if op not in _OPS_WITH_GRADIENTS:
        raise RuntimeError("dtrain.torch: an allreduce by Min, Max or Product has no gradient "
                           "here; detach its input, or reduce by Sum, Average or Adasum")
    return synchronize(allreduce_async(grad.contiguous(), None, name, op, prescale_factor,
                                       postscale_factor, ps))


def _allgather_grad(grad: torch.Tensor, rows: int, name: str | None, ps: Any) -> torch.Tensor:
    averaged = synchronize(allreduce_async(grad.contiguous(), None, name, Average,
                                           process_set=ps))
    counts = synchronize(allgather_async(torch.tensor([rows], dtype=torch.int64),
                                         _grad_name(name, "rows"), ps))
    first = int(counts[:_set_rank(_set_id(ps))].sum())
    return averaged.narrow(0, first, rows)


def _reducescatter_grad(grad: torch.Tensor, name: str | None, op: int,
                        scale: float, ps: Any) -> torch.Tensor:
    gathered = synchronize(allgather_async(grad.contiguous(), name, ps))
    factor = scale * (_set_size(_set_id(ps)) if op == Sum else 1)
    return gathered * factor if factor != 1 else gathered


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None, op: int,
                prescale_factor: float, postscale_factor: float, ps: Any) -> torch.Tensor:
        ctx.saved = (name, op, prescale_factor, postscale_factor, ps)
        return synchronize(allreduce_async(tensor, None, name, op, prescale_factor,
                                           postscale_factor, ps))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        name, op, prescale_factor, postscale_factor, ps = ctx.saved
        return (_allreduce_grad(grad, _grad_name(name), op, prescale_factor, postscale_factor,
                                ps),
                None, None, None, None, None)


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, name: str | None, op: int, prescale_factor: float,
                postscale_factor: float, ps: Any,
                *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.saved = (name, op, prescale_factor, postscale_factor, ps)
        return tuple(synchronize(grouped_allreduce_async(
            list(tensors), None, name, op, prescale_factor=prescale_factor,
            postscale_factor=postscale_factor, process_set=ps)))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        name, op, prescale_factor, postscale_factor, ps = ctx.saved
        if op not in _OPS_WITH_GRADIENTS:
            _allreduce_grad(grads[0], None, op, 1.0, 1.0, ps)  # raises
        reduced = synchronize(grouped_allreduce_async(
            [g.contiguous() for g in grads], None, _grad_name(name), op,
            prescale_factor=prescale_factor, postscale_factor=postscale_factor, process_set=ps))
        return (None, None, None, None, None, *reduced)


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None, ps: Any) -> torch.Tensor:
        gathered = synchronize(allgather_async(tensor, name, ps))  # refuses a scalar first
        ctx.saved = (tensor.shape[0], name, ps)
        return gathered

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        rows, name, ps = ctx.saved
        return _allgather_grad(grad, rows, _grad_name(name), ps), None, None


class _GroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, name: str | None, ps: Any,
                *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        gathered = tuple(synchronize(grouped_allgather_async(list(tensors), name, ps)))
        ctx.saved = ([t.shape[0] for t in tensors], name, ps)
        return gathered

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        rows, name, ps = ctx.saved
        base = _grad_name(name)
        return (None, None, *[_allgather_grad(g, n, _grad_name(base, str(i)), ps)
                              for i, (g, n) in enumerate(zip(grads, rows))])


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, root_rank: int,
                name: str | None, ps: Any) -> torch.Tensor:
        ctx.saved = (root_rank, name, ps)
        return synchronize(broadcast_async(tensor, root_rank, name, ps))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        root_rank, name, ps = ctx.saved
        averaged = synchronize(allreduce_async(grad.contiguous(), None, _grad_name(name),
                                               Average, process_set=ps))
        mine = averaged if rank() == root_rank else torch.zeros_like(averaged)
        return mine, None, None, None


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, splits: Any,
                name: str | None, ps: Any) -> tuple[torch.Tensor, torch.Tensor]:
        received, counts = synchronize(alltoall_async(tensor, splits, name, ps))
        ctx.saved = (counts, name, ps)
        ctx.mark_non_differentiable(counts)
        return received, counts

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, _counts_grad: Any) -> tuple[Any, ...]:
        counts, name, ps = ctx.saved
        back, _ = synchronize(alltoall_async(grad.contiguous(), counts, _grad_name(name), ps))
        return back, None, None, None


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None, op: int,
                prescale_factor: float, postscale_factor: float, ps: Any) -> torch.Tensor:
        ctx.saved = (name, op, prescale_factor * postscale_factor, ps)
        return synchronize(reducescatter_async(tensor, name, op, ps, prescale_factor,
                                               postscale_factor))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        name, op, scale, ps = ctx.saved
        return (_reducescatter_grad(grad, _grad_name(name), op, scale, ps),
                None, None, None, None, None)


class _GroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, name: str | None, op: int, prescale_factor: float,
                postscale_factor: float, ps: Any,
                *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.saved = (name, op, prescale_factor * postscale_factor, ps)
        return tuple(synchronize(grouped_reducescatter_async(
            list(tensors), name, op, ps, prescale_factor, postscale_factor)))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        name, op, scale, ps = ctx.saved
        base = _grad_name(name)
        return (None, None, None, None, None,
                *[_reducescatter_grad(g, _grad_name(base, str(i)), op, scale, ps)
                  for i, g in enumerate(grads)])


# --- the public, synchronous forms ----------------------------------------------------------------

def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
              compression: type[Compressor] | Compressor = Compression.none,
              op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: object = None) -> torch.Tensor:
    """`tensor` reduced over all ranks (Average by default), as a new tensor; differentiable."""
    op = _reduce_op(average, op)
    compressed, ctx = compression.compress(tensor)
    out = _Allreduce.apply(compressed, name, op, prescale_factor, postscale_factor, process_set)
    return compression.decompress(out, ctx)


def grouped_allreduce(tensors: Iterable[torch.Tensor], average: bool | None = None,
                      name: str | None = None,
                      compression: type[Compressor] | Compressor = Compression.none,
                      op: int | None = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0,
                      process_set: object = None) -> list[torch.Tensor]:
    """Each tensor reduced over all ranks, negotiated and fused together; differentiable."""
    op = _reduce_op(average, op)
    pairs = [compression.compress(t) for t in tensors]
    outs = _GroupedAllreduce.apply(name, op, prescale_factor, postscale_factor, process_set,
                                   *[p[0] for p in pairs])
    return [compression.decompress(o, p[1]) for o, p in zip(outs, pairs)]


def allgather(tensor: torch.Tensor, name: str | None = None,
              process_set: object = None) -> torch.Tensor:
    """Every rank's `tensor` concatenated along the first dimension, in rank order;
    differentiable."""
    return _Allgather.apply(tensor, name, process_set)


def grouped_allgather(tensors: Iterable[torch.Tensor], name: str | None = None,
                      process_set: object = None) -> list[torch.Tensor]:
    """An allgather of each tensor, negotiated together; differentiable."""
    return list(_GroupedAllgather.apply(name, process_set, *tensors))


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None,
              process_set: object = None) -> torch.Tensor:
    """Root's `tensor`, as a new tensor on every rank; differentiable."""
    return _Broadcast.apply(tensor, root_rank, name, process_set)


def alltoall(tensor: torch.Tensor, splits: Sequence[int] | torch.Tensor | None = None,
             name: str | None = None,
             process_set: object = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Sends splits[r] rows of `tensor` to rank r (an even split when None) and returns the rows
    every rank sent this one, in rank order; with `splits` given, also how many came from each
    rank (int32), as Horovod does. Differentiable."""
    received, counts = _Alltoall.apply(tensor, splits, name, process_set)
    return received if splits is None else (received, counts)


def reducescatter(tensor: torch.Tensor, name: str | None = None,
                  compression: type[Compressor] | Compressor = Compression.none,
                  op: int | None = Average, process_set: object = None,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> torch.Tensor:
    """`tensor` reduced over all ranks (Average by default), this rank's rows of it; the lower
    ranks take one more row when the first dimension does not divide. Differentiable."""
    op = _reduce_op(None, op)
    compressed, ctx = compression.compress(tensor)
    out = _Reducescatter.apply(compressed, name, op, prescale_factor, postscale_factor,
                               process_set)
    return compression.decompress(out, ctx)


def grouped_reducescatter(tensors: Iterable[torch.Tensor], name: str | None = None,
                          compression: type[Compressor] | Compressor = Compression.none,
                          op: int | None = Average, process_set: object = None,
                          prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list[torch.Tensor]:
    """A reducescatter of each tensor, negotiated together; differentiable."""
    op = _reduce_op(None, op)
    pairs = [compression.compress(t) for t in tensors]
    outs = _GroupedReducescatter.apply(name, op, prescale_factor, postscale_factor,
                                       process_set, *[p[0] for p in pairs])
    return [compression.decompress(o, p[1]) for o, p in zip(outs, pairs)]
