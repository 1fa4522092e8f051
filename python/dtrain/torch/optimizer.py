"""Horovod's DistributedOptimizer: wraps a torch optimizer so that gradients are averaged over
all ranks, each allreduce starting as soon as backward has accumulated that gradient (or its
group's last one; see DistributedOptimizer's `groups`). Sparse
gradients (``nn.Embedding(sparse=True)``) are exchanged as Horovod does: their indices and values
allgathered, the result a sparse gradient again (or densified and allreduced with
``sparse_as_dense=True``)."""

from __future__ import annotations

import contextlib
import os
import warnings
from typing import TYPE_CHECKING, Any, NoReturn, overload

import torch

from .. import _dtrain
from ..errors import InvalidArgument
from .compression import Compression
from .ops import (
    Adasum, Average, Sum, _AllOf, _handle, _handles, _reduce_op, _submitted_together, _take,
    allgather_async, allreduce_async_, synchronize,
)
from .process_sets import _set_id, _set_size

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator
    from typing import TypeVar

    from .compression import Compressor

    _Optimizer = TypeVar("_Optimizer", bound=torch.optim.Optimizer)

__all__ = ["DistributedOptimizer"]

# Steps every DistributedOptimizer of this process has taken: an elastic job's reset tells the
# launcher how many it rolls back (elastic.py).
_steps_taken = 0


def steps_taken() -> int:
    return _steps_taken


def _count_step() -> None:
    global _steps_taken
    _steps_taken += 1


class _DistributedOptimizer(torch.optim.Optimizer):
    # Horovod's construction: this class's methods over the wrapped optimizer's class, built from
    # the wrapped optimizer's param_groups (see DistributedOptimizer below).
    def __init__(self, params: Iterable[dict[str, Any]],
                 named_parameters: Iterable[tuple[str, torch.Tensor]] | None,
                 compression: type[Compressor] | Compressor, backward_passes_per_step: int, op: int,
                 gradient_predivide_factor: float, sparse_as_dense: bool,
                 process_set: object, groups: int | list[list[torch.Tensor]] | None = None
                 ) -> None:
        # The wrapped class's __init__ (its own defaults), not torch.optim.Optimizer's.
        super(self.__class__, self).__init__(params)  # type: ignore[call-arg]
        self._compression = compression
        self._op = op
        self._predivide = gradient_predivide_factor
        self._sparse_as_dense = sparse_as_dense
        self._process_set = process_set
        pid = _set_id(process_set)
        if backward_passes_per_step < 1:
            raise ValueError("backward_passes_per_step must be at least 1")
        self.backward_passes_per_step = backward_passes_per_step

        self._name_parameters(named_parameters)
        all_params = [p for group in self.param_groups for p in group["params"]]
        # parameter -> (handle, compression context), this step
        self._handles: dict[torch.Tensor, tuple[int | None, Any]] = {}
        self._delay = {p: backward_passes_per_step for p in all_params}
        self._requires_update: set[torch.Tensor] = set()
        self._grad_accs: list[Any] = []
        self._synchronized = False
        self._should_synchronize = True
        self._group_of = _parameter_groups(groups, all_params, self._parameter_names)
        # Without groups, whether to overlap is decided at the first gradient, where the
        # parameters are (a model may move to a GPU after its optimizer is made).
        self._overlap_undecided = groups is None
        self._overlap_setting = _overlap_setting()  # a bad value fails here, not in backward
        # Per group: its parameters whose gradients are ready this step (submitted together once
        # all are).
        self._group_ready: dict[int, list[torch.Tensor]] = {}
        # An elastic job may grow from one worker: its hooks are there from the start.
        if _set_size(pid) > 1 or _dtrain.collectives_is_elastic():
            self._register_hooks()

    def _name_parameters(self, named_parameters: Iterable[tuple[str, torch.Tensor]] | None
                         ) -> None:
        """Horovod's _parameter_names (read by tools) and each parameter's collective's name."""
        all_params = [p for group in self.param_groups for p in group["params"]]
        if named_parameters is not None:
            named = list(named_parameters)
            if not all(isinstance(p, tuple) and len(p) == 2 for p in named):
                raise ValueError("named_parameters must be (name, parameter) pairs, e.g. "
                                 "model.named_parameters()")
            names = [n for n, _ in named]
            if len(set(names)) != len(names):
                dups = sorted({n for n in names if names.count(n) > 1})
                raise ValueError("named_parameters has duplicate names: %s" % ", ".join(dups))
            self._parameter_names = {p: n for n, p in named}  # Horovod's attribute, read by tools
            self._names = {p: "allreduce." + n for n, p in named}
            unnamed = [p for p in all_params if p not in self._names]
            if unnamed:
                raise ValueError("named_parameters does not name %d of the optimizer's parameters; "
                                 "pass model.named_parameters() of the model the optimizer "
                                 "updates" % len(unnamed))
        else:
            self._parameter_names = {p: "noname.%d" % i for i, p in enumerate(all_params)}
            self._names = {p: "allreduce.noname.%d" % i for i, p in enumerate(all_params)}

    def _forget_pending(self) -> None:
        """Drops the reductions of a step the job broke under (dtrain.torch.elastic rolls back
        to the last commit): their handles died with the collectives."""
        self._handles.clear()
        self._group_ready.clear()
        for p in self._delay:
            self._delay[p] = self.backward_passes_per_step
        self._synchronized = False

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Horovod's: how many backward passes accumulate locally before a reduction."""
        if passes < 1:
            raise ValueError("backward_passes_per_step must be at least 1")
        self.backward_passes_per_step = passes
        self._group_ready.clear()
        for p in self._delay:
            self._delay[p] = passes

    def _register_hooks(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if not p.requires_grad:
                    continue
                # No zeros in .grad beforehand: backward then adds a sparse gradient into a dense
                # one, and a sparse optimizer (SparseAdam) refuses the result.
                self._requires_update.add(p)
                # The gradient accumulator's hook runs once backward has added into p.grad.
                accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
                accumulator.register_hook(self._make_hook(p))
                self._grad_accs.append(accumulator)

    def _make_hook(self, p: torch.Tensor) -> Callable[..., None]:
        def hook(*ignore: object) -> None:
            if p in self._handles and self._delay[p] <= 0:
                raise AssertionError(
                    "Gradients were computed more than backward_passes_per_step times before call "
                    "to step(). Increase backward_passes_per_step to accumulate gradients "
                    "locally.")
            self._delay[p] -= 1
            self._handles[p] = (None, None)
            if self._overlap_undecided:
                self._overlap_undecided = False
                all_params = [q for group in self.param_groups for q in group["params"]]
                if not _overlap_gradients(all_params, self._overlap_setting):  # one group
                    self._group_of = _parameter_groups(1, all_params, self._parameter_names)
            if self._delay[p] > 0:
                return
            group = self._group_of.get(p)
            if group is None:
                self._handles[p] = self._allreduce_grad_async(p)
                return
            ready = self._group_ready.setdefault(id(group), [])
            ready.append(p)
            if len(ready) == len(group):  # the group's last gradient: all go together
                del self._group_ready[id(group)]
                with _submitted_together(_set_id(self._process_set)):
                    for q in group:
                        self._handles[q] = self._allreduce_grad_async(q)
        return hook

    def _allreduce_grad_async(self, p: torch.Tensor) -> tuple[int, Any]:
        if p.grad is None:
            p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
        tensor = p.grad
        if tensor.is_sparse:
            if not self._sparse_as_dense:
                return sparse_allreduce_async(tensor, self._names[p], self._op,
                                              self._process_set), None
            # A dense copy goes out; .grad stays sparse (a sparse optimizer such as SparseAdam
            # refuses dense gradients) and gets the result as a sparse tensor (synchronize).
            tensor = tensor.to_dense()
        prescale = postscale = 1.0
        if self._predivide != 1.0:
            prescale, postscale = 1.0 / self._predivide, self._predivide
        compressed, ctx = self._compression.compress(tensor)
        handle = allreduce_async_(compressed, name=self._names[p], op=self._op,
                                  prescale_factor=prescale, postscale_factor=postscale,
                                  process_set=self._process_set)
        return handle, ctx

    def synchronize(self) -> None:
        """Waits for every gradient's allreduce and writes the results into .grad. A parameter
        backward did not reach takes part with zeros (every rank must submit it)."""
        with _submitted_together(_set_id(self._process_set)):
            for p in self._requires_update - set(self._handles):
                self._handles[p] = self._allreduce_grad_async(p)
            for p, (handle, ctx) in list(self._handles.items()):
                if handle is None:  # its group is incomplete, or its passes are not done
                    self._handles[p] = self._allreduce_grad_async(p)
        self._group_ready.clear()
        try:
            for p, (handle, ctx) in self._handles.items():
                output = synchronize(handle)  # type: ignore[arg-type]  # no None left (above)
                self._delay[p] = self.backward_passes_per_step
                if output.is_sparse:  # a new sparse gradient, of every rank's rows
                    p.grad = output
                    continue
                result = self._compression.decompress(output, ctx)
                if p.grad is not None and p.grad.is_sparse:  # sparse_as_dense
                    p.grad = result.to_sparse()
                    continue
                if result is not p.grad:
                    p.grad.copy_(result)  # type: ignore[union-attr]  # set by _allreduce_grad_async
        finally:
            self._handles.clear()
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """``with opt.skip_synchronize(): opt.step()`` after an explicit synchronize()."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    # torch.optim.Optimizer's overloads; torch 1.x declares one step(closure=None) -> float | None.
    @overload  # type: ignore[override, unused-ignore]
    def step(self, closure: None = None) -> None: ...

    @overload
    def step(self, closure: Callable[[], float]) -> float: ...

    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "context after optimizer.synchronize(). This can cause training "
                              "slowdown. You may want to consider using "
                              "optimizer.skip_synchronize() context if you use "
                              "optimizer.synchronize() in your code.")
            self.synchronize()
        self._synchronized = False
        result = super(self.__class__, self).step(closure)
        _count_step()
        return result

    def zero_grad(self, set_to_none: bool = False) -> None:
        if self._handles:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but "
                                 "before optimizer.step() or optimizer.synchronize(). This is "
                                 "prohibited as it can cause a race condition.")
        return super(self.__class__, self).zero_grad(set_to_none)


# Typed as the optimizer's own class, whose subclass it returns, so that Horovod's `optimizer =
# hvd.DistributedOptimizer(optimizer, ...)` type-checks; the type lacks synchronize() and
# skip_synchronize().
# Horovod's DistributedOptimizer(op=Adasum): each rank takes its own optimizer step and the ranks
# combine the changes of the parameters (not the gradients) by Adasum. As soon as backward has
# accumulated a parameter's gradient, the wrapped optimizer steps that parameter alone (its momentum
# or Adam state stays this rank's own), the change is allreduced with op=Adasum (ops.py), and step()
# adds the combined change to the parameter as it was before. Between backward and step() the
# parameter holds this rank's change, as in Horovod.
class _DistributedAdasumOptimizer(_DistributedOptimizer):
    # Only these methods differ: DistributedOptimizer lays them over _DistributedOptimizer's own
    # (names, hooks, zero_grad) when it builds the wrapped optimizer's class.

    def __init__(self, *args: Any) -> None:
        _DistributedOptimizer.__init__(self, *args)
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
        # Parameters backward did not reach take part too (every rank submits each of them),
        # as do those of a group it did not complete.
        with _submitted_together(_set_id(self._process_set)):
            for p in self._requires_update:
                if self._handles.get(p, (None, None))[0] is None:
                    self._handles[p] = self._allreduce_grad_async(p)
        self._group_ready.clear()
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
        _count_step()
        return loss


def DistributedOptimizer(optimizer: _Optimizer,
                         named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
                         compression: type[Compressor] | Compressor = Compression.none,
                         backward_passes_per_step: int = 1, op: int = Average,
                         gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                         groups: object = None, sparse_as_dense: bool = False,
                         process_set: object = None) -> _Optimizer:
    """`optimizer` (a torch.optim.Optimizer) whose step() first averages every gradient over all
    ranks (op=Sum sums). Each allreduce starts from an autograd hook as soon as its gradient is
    accumulated, so communication overlaps the rest of backward (but see `groups` below). With
    `backward_passes_per_step` = k, gradients accumulate locally over k backward passes and are
    reduced once. `compression=Compression.fp16` sends float16. Sparse gradients are allgathered
    (indices and values) unless `sparse_as_dense`. With `process_set`, gradients are averaged over
    its ranks only (each rank calls this with the set it belongs to). With op=Adasum each rank
    steps on its own and the ranks combine the parameters' changes by Adasum
    (a power-of-two number of ranks). `groups` (Horovod's): an int k splits the parameters,
    ordered by name, into k groups as even as can be; a list of lists of parameters gives the
    groups (a parameter in none is reduced alone). A group's gradients are reduced together, in
    one fusion batch, once backward has produced all of them; `num_groups` is the old name of an
    int `groups`. Without `groups`, each gradient goes from its hook, except where the ranks train
    on CPUs with no core to spare for communication: there all go together once backward is done
    (DTRAIN_OVERLAP_GRADIENTS)."""
    op = _reduce_op(None, op)
    if num_groups != 0:
        warnings.warn("DistributedOptimizer: num_groups is Horovod's old name; pass groups",
                      DeprecationWarning, stacklevel=2)
        if groups is None:
            groups = num_groups
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    members = dict(_DistributedOptimizer.__dict__)
    if op == Adasum and _set_size(_set_id(process_set)) > 1:
        # Horovod's delta optimizer: ranks step on their own and combine the changes.
        members.update((k, v) for k, v in _DistributedAdasumOptimizer.__dict__.items()
                       if not k.startswith("__") or k == "__init__")
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), members)
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step,
               op, gradient_predivide_factor, sparse_as_dense, process_set, groups)


def _overlap_setting() -> str:
    setting = os.environ.get("DTRAIN_OVERLAP_GRADIENTS", "auto")
    if setting not in ("auto", "0", "1"):
        raise ValueError("DTRAIN_OVERLAP_GRADIENTS=%r: auto, 1 (from the hooks) or 0 (together "
                         "after backward)" % setting)
    return setting


def _overlap_gradients(params: list[torch.Tensor], setting: str) -> bool:
    """Whether each gradient's allreduce starts from its hook, overlapping the rest of backward
    (Horovod's way), rather than all together once backward is done. Overlap needs a core for the
    engine while the training computes: where a host's ranks train on the CPU and have no core to
    spare (as many ranks as usable cores, or more), the engine's rounds during backward only take
    turns with the training on its cores, each turn a wake-up and a switch, and the gradients
    reduced together after backward gave 1-10% shorter steps (docs/performance.md). On one host
    the results are the same bits either way (each element is summed by one rank, in rank order);
    across hosts the size of a fused batch may choose another algorithm, with another order of
    summing. DTRAIN_OVERLAP_GRADIENTS=1 or 0 decides instead; an explicit `groups` wins over
    both."""
    if setting != "auto":
        return setting == "1"
    on_cpu = all(p.device.type == "cpu" for p in params)
    return not on_cpu or _dtrain.collectives_local_size() < _dtrain.usable_cores()


def _parameter_groups(groups: object, params: list[torch.Tensor],
                      names: dict[torch.Tensor, str]) -> dict[torch.Tensor, list[torch.Tensor]]:
    """Each grouped parameter's group (DistributedOptimizer's `groups`), checked as Horovod
    does."""
    if groups is None:
        return {}
    trained = [p for p in params if p.requires_grad]
    if isinstance(groups, bool) or not isinstance(groups, (int, list)) or \
            (isinstance(groups, int) and groups <= 0):
        raise ValueError("groups should be a positive integer or a list of lists of parameters, "
                         "not %r" % (groups,))
    if isinstance(groups, int):
        # By name, so that every rank forms the same groups.
        ordered = sorted(trained, key=lambda p: names[p])
        size, extra = divmod(len(ordered), groups)
        lists, at = [], 0
        for i in range(groups):
            n = size + (1 if i < extra else 0)
            lists.append(ordered[at:at + n])
            at += n
    else:
        lists = [list(g) for g in groups]
        known = {id(p) for p in params}
        seen: set[int] = set()
        for group in lists:
            for p in group:
                if not isinstance(p, torch.Tensor):
                    raise ValueError("groups must consist of torch.Tensor, not %s"
                                     % type(p).__name__)
                if id(p) in seen:
                    raise ValueError("a parameter can only appear once in groups")
                if id(p) not in known:
                    raise ValueError("groups names a tensor that is not one of the optimizer's "
                                     "parameters")
                seen.add(id(p))
    # Only gradients that backward produces count towards a group's completion.
    trained_lists = [[p for p in group if p.requires_grad] for group in lists]
    return {p: group for group in trained_lists for p in group}


class SparseAllreduceHandle(int):
    """What sparse_allreduce_async returns: a handle for synchronize() and poll(), and, as
    Horovod's is, callable: ``handle()`` waits and gives the result."""

    def __call__(self) -> torch.Tensor:
        result: torch.Tensor = synchronize(self)
        return result


def sparse_allreduce_async(tensor: torch.Tensor, name: str, op: int,
                           process_set: object = None) -> SparseAllreduceHandle:
    """Starts Horovod's allreduce of a sparse COO tensor: every rank's indices and values
    allgathered (values divided by the number of ranks for Average). ``handle()`` (Horovod's
    form) or synchronize(handle) gives the sparse result, uncoalesced (indices may repeat; torch
    sums them)."""
    op = _reduce_op(None, op)
    if op not in (Average, Sum):
        raise ValueError("a sparse allreduce sums or averages, not op=%r" % (op,))
    if not isinstance(tensor, torch.Tensor) or not tensor.is_sparse:
        raise InvalidArgument("sparse_allreduce_async takes a sparse COO tensor (allreduce_async "
                              "takes dense ones)")
    t = tensor.coalesce()  # itself when coalesced already
    # allgather concatenates along the first dimension: one row per nonzero.
    indices = allgather_async(t.indices().t().contiguous(), name + ".indices", process_set)
    values = allgather_async(t.values().contiguous(), name + ".values", process_set)
    ranks = _set_size(_set_id(process_set))

    def finish() -> torch.Tensor:
        rows = _take(indices).finish()
        vals = _take(values).finish()
        if op == Average:
            vals = vals / ranks
        return torch.sparse_coo_tensor(rows.t(), vals, t.shape)

    return SparseAllreduceHandle(
        _handle(_AllOf([_handles[indices].op, _handles[values].op]), finish))
