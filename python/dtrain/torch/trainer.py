"""A Gluon-style Trainer for PyTorch modules over a dtrain KVStore.

    kv = dtrain.kv.create('dist_sync')
    trainer = dtrain.torch.Trainer(net, 'sgd', {'learning_rate': 0.1, 'momentum': 0.9}, kvstore=kv)
    for data, label in loader:
        loss = loss_fn(net(data), label)      # a sum over the batch, as Gluon's losses
        loss.backward()
        trainer.step(data.shape[0])

It runs on the same C++ engine as dtrain's LibTorch Trainer (ParameterSync): each parameter's
gradient is pushed from an autograd hook as soon as backward has produced it (small parameters
travel fused in buckets), rank 0's initial weights become everyone's, and the optimizer runs on
the servers (update_on_kvstore, the default for dist stores) or here, with identical results.
Gradients are rescaled by 1/(batch_size x num_workers) in dist_sync, so N workers with batch b
follow one worker with batch N x b.

Parameters may be float32, float16 or bfloat16: half-precision ones train through float32 master
weights (MXNet's multi_precision), kept by the store (or here, without update_on_kvstore); their
gradients travel as float32.

Sparse gradients (``nn.Embedding(sparse=True)``, ``nn.EmbeddingBag(sparse=True)``): with a dist
store applying the optimizer, a table on the CPU big enough for a key of its own travels as rows,
MXNet's row_sparse: a step pushes only the rows its batch touched, the servers update only those
(MXNet's lazy_update; ``lazy_update=0`` in the optimizer's parameters gives the dense formula),
and the embedding's forward pulls only the rows its ids read before it runs. The rest of the table
here is refreshed by ``wait()`` (before evaluating or saving). Elsewhere sparse gradients travel
dense, as Horovod's ``sparse_as_dense``.

Given a module (or a list of replicas, one per local device), the Trainer makes each submodule's
forward wait only for its own parameters' new weights, so the next forward overlaps the exchange
of later layers. Given bare parameters it cannot see the forward: step() then waits for every
new weight before it returns.
"""

from __future__ import annotations

import pickle
import time
import warnings
import weakref
from typing import TYPE_CHECKING, Any, NoReturn

import torch

from .. import _dtrain, _lifetime
from .. import kv as _kv
from .. import optimizer as _opt
from ..errors import InvalidArgument

if TYPE_CHECKING:
    import os
    from collections.abc import Callable, Iterable, Mapping, Sequence
    from typing import TypeAlias

    # A module, replicas of one (a module per local device), or parameters: tensors, (name,
    # tensor) pairs, or a dict of them.
    _Params: TypeAlias = (torch.nn.Module | Sequence[torch.nn.Module]
                          | dict[str, torch.Tensor] | dict[str, torch.nn.Parameter]
                          | Iterable[torch.Tensor | tuple[str, torch.Tensor]])
    _Path: TypeAlias = str | os.PathLike[str]

__all__ = ["Trainer"]


def _replicas_of(params: Any) -> tuple[list[list[tuple[str, torch.Tensor]]],
                                      list[torch.nn.Module] | None]:
    """(list of replicas, each a list of (name, parameter); list of modules or None)."""
    if isinstance(params, torch.nn.Module):
        params = [params]
    if isinstance(params, (list, tuple)) and params and all(
            isinstance(m, torch.nn.Module) for m in params):
        modules = list(params)
        return [[(n, p) for n, p in m.named_parameters() if p.requires_grad]
                for m in modules], modules
    if isinstance(params, dict):
        items = list(params.items())
    else:
        items = list(params)
        items = [p if isinstance(p, tuple) else (str(i), p) for i, p in enumerate(items)]
    if not items or not all(isinstance(p, torch.Tensor) for _, p in items):
        raise TypeError("Trainer takes a module, a list of replicas (modules), or parameters "
                        "(an iterable of tensors, (name, tensor) pairs or a dict)")
    return [[(n, p) for n, p in items if p.requires_grad]], None


class Trainer:
    """Applies an optimizer to a model's parameters, kept identical on every worker.

    params: a torch.nn.Module, a list of replicas (the same module once per local device, whose
        gradients the store sums), or an iterable of parameters.
    optimizer: a name ('sgd', 'nag', 'adam', 'adagrad', 'rmsprop') or a dtrain.optimizer
        Optimizer; optimizer_params: its parameters with MXNet's names.
    kvstore: a store type (default 'dist_sync') or a dtrain.kv.KVStore.
    compression_params: gradient compression of the pushes, e.g. {'type': '2bit',
        'threshold': 0.5} (see dtrain.kv.KVStore.set_gradient_compression).
    update_on_kvstore: run the optimizer on the store's side (the servers' for dist stores;
        required by dist_async) or here (False). Default: on the store's side, except for a local
        store ('local', 'device') with CUDA parameters: there the optimizer runs here, on the GPU.
        A saved optimizer state loads only under the same choice (pass it explicitly to load
        one saved under the other).
    fuse_below_kb: parameters smaller than this travel together as one key (0: never).
    overlap: True (the default): each parameter's gradient leaves from an autograd hook as soon
        as backward has produced it, and a module's forward waits only for its own parameters'
        new weights. False: the gradients leave at step(), which waits for every new weight
        before it returns (the simplest order to reason about; slower).
    backward_passes_per_step: gradient accumulation (Horovod's name): each step sums the
        gradients of this many backward passes (pass step() the samples of all of them); a
        parameter's gradient leaves during its last pass. A backward beyond them before step()
        is an error, raised by the next step, never ignored.
    """

    def __init__(self, params: _Params, optimizer: str | _opt.Optimizer,
                 optimizer_params: Mapping[str, Any] | None = None,
                 kvstore: str | _kv.KVStore = "dist_sync",
                 compression_params: dict[str, Any] | None = None,
                 update_on_kvstore: bool | None = None, fuse_below_kb: float = 64,
                 overlap: bool = True, backward_passes_per_step: int = 1) -> None:
        replicas, modules = _replicas_of(params)
        if isinstance(optimizer, _opt.Optimizer):
            if optimizer_params:
                raise ValueError("optimizer_params must be empty when optimizer is an Optimizer")
            self._optimizer = optimizer
        else:
            self._optimizer = _opt.create(optimizer, **dict(optimizer_params or {}))
        self._kv = _kv.create(kvstore) if isinstance(kvstore, str) else kvstore
        if not isinstance(self._kv, _kv.KVStore):
            raise TypeError("kvstore must be a type name or a dtrain.kv.KVStore")
        self._owns_kv = isinstance(kvstore, str)
        if compression_params:
            self._kv.set_gradient_compression(compression_params)
        if update_on_kvstore is None:
            update_on_kvstore = _dtrain.default_update_on_kvstore(
                self._kv.type, any(p.is_cuda for r in replicas for _, p in r))
        if len({len(r) for r in replicas}) != 1:
            raise InvalidArgument("the replicas have different numbers of parameters")
        self._params = [p for _, p in replicas[0]]
        self._names = [n for n, _ in replicas[0]]
        self._devices = [[p.device for _, p in r] for r in replicas]
        self._all_indexes = list(range(len(self._params)))
        self._modules = modules
        self._batch_size: int | None = None
        self._steps = 0
        self._gates: list[torch.utils.hooks.RemovableHandle] = []
        self._warned_batch = False
        self._update_on_kvstore = bool(update_on_kvstore)
        name, spec_params, schedule = self._optimizer._spec()
        self._sync = _dtrain.ParameterSync(
            [[p for _, p in r] for r in replicas], self._kv._h, name, spec_params, schedule,
            0, bool(update_on_kvstore), bool(overlap), int(fuse_below_kb * 1024),
            int(backward_passes_per_step))
        # The hooks hold this trainer weakly and go with it: a trainer made again on the same
        # module (without close) leaves no hooks of the old one behind.
        weakref.finalize(self, _remove_hooks, self._gates)
        if modules is not None:
            self._install_gates(modules)
            if _dtrain.timeline_enabled():
                self._install_timeline(modules[0])
        self._forward_begin = 0.0
        self._forward_end: float | None = None
        _lifetime.register(self, _lifetime.TRAINER)
        if modules is not None:
            for m in modules[1:]:
                _copy_buffers(modules[0], m)

    # --- the Gluon Trainer's API ---
    def step(self, batch_size: int, ignore_stale_grad: bool = False) -> None:
        """Ends a step of `batch_size` samples (this worker's, over all its devices): sends the
        gradients backward has not sent yet; the new weights arrive in the background.

        A parameter whose gradient no backward produced since the last step (the forward did not
        use it) is an error, as in Gluon, raised before anything more is sent: it names the
        parameter. With ignore_stale_grad=True such a gradient counts as zeros in the workers'
        sum instead. Unlike Gluon, the parameter is still updated with that sum (other workers
        may have used it; a local skip would let the replicas drift apart), so momentum and weight
        decay still move a parameter that no worker used; a table that travels as rows pushes no
        row instead, and a lazy update leaves it as it was."""
        if not ignore_stale_grad:
            self._refuse_stale_gradients()
        if self._forward_end is not None:  # the timeline's backward: from forward's end to here
            _dtrain.timeline_span("backward", self._forward_end, time.time(), self._steps)
            self._forward_end = None
        self._steps += 1
        batch_size = int(batch_size)
        if self._batch_size is None:
            self._batch_size = batch_size
        elif batch_size != self._batch_size:
            # The gradients left during backward, normalised by the first step's size (as MXNet's
            # Trainer with update_on_kvstore warns and does).
            if not self._warned_batch:
                warnings.warn("step(%d) after step(%d): this step's gradients are normalised by "
                              "1/%d because they leave during backward; use drop_last=True in the "
                              "DataLoader for exact normalisation"
                              % (batch_size, self._batch_size, self._batch_size))
                self._warned_batch = True
            batch_size = self._batch_size
        self._sync.step(batch_size)
        if self._modules is None:
            self._sync.wait_for(self._all_indexes)

    def _refuse_stale_gradients(self) -> None:
        stale = self._sync.stale_gradients()
        if stale:
            index, replica = stale[0]
            more = " (and %d more)" % (len(stale) - 1) if len(stale) > 1 else ""
            raise InvalidArgument(
                "the gradient of parameter '%s' on %s%s has not been produced by backward since "
                "the last step: the forward did not use it. If that is intended, call "
                "step(batch_size, ignore_stale_grad=True): its gradient then counts as zeros"
                % (self._names[index], self._devices[replica][index], more))

    def wait(self) -> None:
        """Blocks until every parameter holds its latest weights (before evaluating or saving)."""
        self._sync.wait_all()

    @property
    def learning_rate(self) -> float:
        return self._sync.learning_rate

    def set_learning_rate(self, lr: float) -> None:
        """Changes the base learning rate from the next step on, wherever the optimizer runs:
        here, or on the servers (every key's update of the next step; rank 0's call sets it,
        MXNet's Trainer could not). Call it on every worker between two steps, as a script
        does; with an lr_scheduler the schedule scales the new rate."""
        self._sync.learning_rate = float(lr)

    @property
    def optimizer(self) -> _opt.Optimizer:
        return self._optimizer

    @property
    def kvstore(self) -> _kv.KVStore:
        return self._kv

    @property
    def update_on_kvstore(self) -> bool:
        """Whether the store's side runs the optimizer (False: this process, on the parameters'
        device)."""
        return self._update_on_kvstore

    def save_states(self, fname: _Path) -> None:
        """Saves the optimizer's state (the servers' with update_on_kvstore; call on rank 0)."""
        state = self._sync.save_optimizer_state()
        with open(fname, "wb") as f:
            pickle.dump({"dtrain_trainer_states": 1, "state": state}, f)

    def load_states(self, fname: _Path) -> None:
        """Restores save_states' file (call on every worker; rank 0 restores the servers)."""
        with open(fname, "rb") as f:
            saved = pickle.load(f)
        if not isinstance(saved, dict) or saved.get("dtrain_trainer_states") != 1:
            raise InvalidArgument("%s was not written by Trainer.save_states" % fname)
        self._sync.load_optimizer_state(saved["state"])

    def close(self) -> None:
        """Waits for the exchanges in flight and stops using the store (also done at exit)."""
        _remove_hooks(getattr(self, "_gates", []))
        self._sync.close()
        if self._owns_kv:
            self._kv.close()

    def allreduce_grads(self) -> NoReturn:
        raise NotImplementedError("gradients are exchanged as backward produces them; call step()")

    def update(self, batch_size: int, ignore_stale_grad: bool = False) -> NoReturn:
        raise NotImplementedError("gradients are exchanged as backward produces them; call step()")

    # --- the timeline (DTRAIN_TIMELINE): forward spans from the top module's hooks ---
    def _install_timeline(self, module: torch.nn.Module) -> None:
        trainer = weakref.ref(self)

        def begin(mod: torch.nn.Module, inputs: tuple[Any, ...]) -> None:
            t = trainer()
            if t is not None:
                t._forward_begin = time.time()

        def end(mod: torch.nn.Module, inputs: tuple[Any, ...], output: Any) -> None:
            t = trainer()
            if t is not None:
                t._forward_end = time.time()
                _dtrain.timeline_span("forward", t._forward_begin, t._forward_end, t._steps)

        self._gates.append(module.register_forward_pre_hook(begin))
        self._gates.append(module.register_forward_hook(end))

    # --- forward gates ---
    def _install_gates(self, modules: list[torch.nn.Module]) -> None:
        for replica in modules:
            index = {id(p): i for i, p in enumerate(
                p for p in replica.parameters() if p.requires_grad)}
            for module in replica.modules():
                own = [index[id(p)] for p in module.parameters(recurse=False) if id(p) in index]
                if own and _sparse_embedding(module) and own == [index[id(module.weight)]]:
                    self._gates.append(module.register_forward_pre_hook(self._rows_gate(own[0])))
                elif own:
                    self._gates.append(module.register_forward_pre_hook(self._gate(own)))

    def _gate(self, indexes: list[int]) -> Callable[[torch.nn.Module, tuple[Any, ...]], None]:
        trainer = weakref.ref(self)

        def wait_for_weights(module: torch.nn.Module, inputs: tuple[Any, ...]) -> None:
            t = trainer()
            if t is not None:
                t._sync.wait_for(indexes)

        return wait_for_weights

    def _rows_gate(self, index: int) -> Callable[[torch.nn.Module, tuple[Any, ...]], None]:
        """An embedding's forward waits only for the rows its ids read."""
        trainer = weakref.ref(self)

        def wait_for_rows(module: torch.nn.Module, inputs: tuple[Any, ...]) -> None:
            t = trainer()
            if t is None:
                return
            if inputs and isinstance(inputs[0], torch.Tensor):
                t._sync.wait_for_rows(index, inputs[0])
            else:  # ids passed by keyword: the hook cannot see them, so the whole table
                t._sync.wait_for([index])

        return wait_for_rows


def _sparse_embedding(module: torch.nn.Module) -> bool:
    return (isinstance(module, (torch.nn.Embedding, torch.nn.EmbeddingBag))
            and bool(module.sparse))


def _remove_hooks(hooks: list[torch.utils.hooks.RemovableHandle]) -> None:
    for h in hooks:
        h.remove()
    hooks.clear()


def _copy_buffers(source: torch.nn.Module, target: torch.nn.Module) -> None:
    with torch.no_grad():
        for (_, b_from), (_, b_to) in zip(source.named_buffers(), target.named_buffers()):
            b_to.copy_(b_from)
