"""Horovod's elastic training API (``hvd.elastic``) on dtrain's allreduce mode.

A Horovod elastic script runs after changing its import line::

    import dtrain.torch as hvd
    hvd.init()
    model, optimizer = ..., hvd.DistributedOptimizer(...)
    state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            for state.batch in range(state.batch, batches):
                step(...)
                if state.batch % 10 == 0:
                    state.commit()
            state.batch = 0

    train(state)

started with ``dtrain launch -s 0 --host-discovery-script ./hosts.sh --min-np 2 --max-np 4 --
python3 train.py``. The launcher runs a worker on every slot the script offers
(launcher/watch/elastic_job.h). When a worker dies, the others' collectives fail with
HorovodInternalError: ``run`` rolls the state back to its last commit, the survivors form a new
membership (new ranks, a smaller size) and the function is called again. When workers are added,
the members learn it at their next ``commit()`` (HostsUpdatedInterrupt), form a membership with
the newcomers and call the function again after ``sync()`` gave everyone rank 0's state.
"""

from __future__ import annotations

import copy
import functools
import math
import sys
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from .. import _dtrain
from ..errors import HorovodInternalError, RemovedFromJob
from . import ops
from .functions import broadcast_optimizer_state, broadcast_parameters
from .optimizer import steps_taken

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

__all__ = ["run", "State", "ObjectState", "TorchState", "ElasticSampler",
           "HorovodInternalError", "HostsUpdatedInterrupt"]

_F = TypeVar("_F", bound="Callable[..., Any]")

# A membership can break while it forms (a worker dies during the rendezvous): join again, this
# many times at most before giving up.
_JOIN_ATTEMPTS = 5


class HostsUpdatedInterrupt(RuntimeError):
    """Raised by ``State.commit()`` on every rank at once when workers came or went since the
    membership formed. ``skip_sync``: workers only left, so the state need not be broadcast
    again (newcomers need rank 0's state)."""

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__("the elastic job's workers changed: forming a new membership")
        self.skip_sync = skip_sync


class State:
    """What an elastic job keeps across memberships: ``commit()`` saves it (and checks for new
    workers), ``restore()`` rolls back to the last commit after a failure, ``sync()`` gives every
    rank rank 0's. Subclasses implement ``save``, ``restore`` and ``sync``."""

    def __init__(self) -> None:
        self._reset_callbacks: list[Callable[[], None]] = []
        # DistributedOptimizer steps at the last commit: those since are redone after a failure.
        self._committed_steps = steps_taken()

    def register_reset_callbacks(self, callbacks: Sequence[Callable[[], None]]) -> None:
        """Functions called after every new membership formed (e.g. to scale the learning rate
        by the new ``size()``)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Saves the state, then raises HostsUpdatedInterrupt if workers came or went."""
        self.save()
        self._committed_steps = steps_taken()
        self.check_host_updates()

    def _roll_back(self) -> None:
        """After a failed collective: back to the last commit, and the launcher told (with the
        next join) how many DistributedOptimizer steps that undoes."""
        self.restore()
        now = steps_taken()
        # A subclass that skipped State.__init__ has no count: nothing to tell.
        _dtrain.elastic_note_rollback(now - getattr(self, "_committed_steps", now))
        self._committed_steps = now

    def check_host_updates(self) -> None:
        """Rank 0 asks the launcher and every rank gets its answer, so that all of them raise
        HostsUpdatedInterrupt at the same commit, or none does. When workers only left, the
        members' committed states are equal: the next membership skips ``sync()``, as
        Horovod's does."""
        update = _dtrain.elastic_hosts_update() if ops.rank() == 0 else "none"
        update = ops.broadcast_object(update, 0, name="elastic.hosts_changed")
        if update != "none":
            raise HostsUpdatedInterrupt(skip_sync=update == "removed")

    def save(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        """After a new membership formed, before the reset callbacks."""


class ObjectState(State):
    """Plain attributes (anything pickle can carry), set from the keyword arguments:
    ``ObjectState(epoch=0, batch=0)`` has ``state.epoch`` and ``state.batch``."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self._saved_state = copy.deepcopy(kwargs)
        for name, value in kwargs.items():
            setattr(self, name, value)

    def save(self) -> None:
        self._saved_state = copy.deepcopy({k: getattr(self, k) for k in self._saved_state})

    def restore(self) -> None:
        for name, value in copy.deepcopy(self._saved_state).items():
            setattr(self, name, value)

    def sync(self) -> None:
        if not self._saved_state:
            return
        self.save()
        self._saved_state = ops.broadcast_object(self._saved_state, 0,
                                                 name="elastic.object_state")
        self.restore()


class _StateDictHandler:
    """Keeps a copy of an object's state_dict at each commit, and loads it back."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self.save()

    def save(self) -> None:
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(self._saved)


class _ModelHandler(_StateDictHandler):
    def sync(self) -> None:
        broadcast_parameters(self.value.state_dict(), root_rank=0)
        self.save()


class _OptimizerHandler(_StateDictHandler):
    def _forget_pending(self) -> None:
        forget = getattr(self.value, "_forget_pending", None)
        if forget is not None:  # a DistributedOptimizer: its step's reductions died
            forget()

    def restore(self) -> None:
        self._forget_pending()
        super().restore()

    def sync(self) -> None:
        self._forget_pending()
        broadcast_optimizer_state(self.value, root_rank=0)
        self.save()


class _SamplerHandler(_StateDictHandler):
    def sync(self) -> None:
        # Every rank processed its own samples: together, they are what the epoch has done.
        states = ops.allgather_object(self.value.state_dict(), name="elastic.sampler_state")
        done: set[int] = set()
        for s in states:
            done.update(s["processed_indices"])
        self.value.load_state_dict({"epoch": states[0]["epoch"],
                                    "processed_indices": sorted(done)})
        self.save()


class TorchState(ObjectState):
    """Horovod's TorchState: a model, an optimizer and ElasticSamplers (as keyword arguments or
    the first two positionally) saved, restored and synced with their state_dicts, plus plain
    attributes as ObjectState's."""

    def __init__(self, model: torch.nn.Module | None = None,
                 optimizer: torch.optim.Optimizer | None = None, **kwargs: Any) -> None:
        self._handlers: dict[str, Any] = {}
        plain = {}
        named = dict(kwargs)
        if model is not None:
            named["model"] = model
        if optimizer is not None:
            named["optimizer"] = optimizer
        for name, value in named.items():
            if isinstance(value, torch.nn.Module):
                self._handlers[name] = _ModelHandler(value)
            elif isinstance(value, torch.optim.Optimizer):
                self._handlers[name] = _OptimizerHandler(value)
            elif isinstance(value, ElasticSampler):
                self._handlers[name] = _SamplerHandler(value)
            else:
                plain[name] = value
        super().__init__(**plain)
        for name, handler in self._handlers.items():
            object.__setattr__(self, name, handler.value)

    def save(self) -> None:
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self) -> None:
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self) -> None:
        for handler in self._handlers.values():
            handler.sync()
        super().sync()

    def reset(self) -> None:
        for handler in self._handlers.values():
            if isinstance(handler, _SamplerHandler):
                handler.value.reset()


class ElasticSampler(torch.utils.data.Sampler[int]):
    """Horovod's ElasticSampler: this rank's share of the samples the epoch has not processed
    yet, re-split whenever the membership changes. Call ``record_batch(i, batch_size)`` after
    each batch (TorchState keeps the processed samples across a reset) and ``set_epoch`` at the
    start of each epoch."""

    def __init__(self, dataset: Any, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_indices: set[int] = set()
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.processed_indices = set()
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        # Synchronous training: every rank has taken its own batch `batch_idx` of this split by
        # now (its gradients were in this step's allreduce), so that batch of every rank's share
        # is done. Horovod records this rank's only: a commit then holds the survivors' samples
        # and not a lost rank's, which the survivors trained again after a reset (issue 63's
        # campaign: +1.4 points of Test_acc for a worker lost near an epoch's end).
        begin, end = batch_idx * batch_size, (batch_idx + 1) * batch_size
        for share in self._shares:
            self.record_indices(share[begin:end])

    def record_indices(self, indices: Sequence[int]) -> None:
        self.processed_indices.update(indices)

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "processed_indices": sorted(self.processed_indices)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = state["epoch"]
        self.processed_indices = set(state["processed_indices"])
        self.reset()

    def reset(self) -> None:
        rank, size = (ops.rank(), ops.size()) if ops.is_initialized() else (0, 1)
        order = list(range(len(self.dataset)))
        if self.shuffle:
            generator = torch.Generator()
            generator.manual_seed(self.seed + self.epoch)
            order = torch.randperm(len(self.dataset), generator=generator).tolist()
        remaining = [i for i in order if i not in self.processed_indices]
        self.num_samples = math.ceil(len(remaining) / size) if remaining else 0
        total = self.num_samples * size
        padded = remaining + remaining[:total - len(remaining)]  # every rank the same count
        self._shares = [padded[r:total:size] for r in range(size)]
        self.indices = self._shares[rank]

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return self.num_samples


def _join_again(state: State) -> None:
    """Horovod's reset: the collectives stop and start again in the next membership."""
    for attempt in range(_JOIN_ATTEMPTS):
        ops.shutdown()
        try:
            ops.init()
            break
        except HorovodInternalError:
            if attempt + 1 == _JOIN_ATTEMPTS:
                raise
    state.on_reset()


def run(func: _F) -> _F:
    """Horovod's ``hvd.elastic.run``: calls ``func(state, ...)`` until it returns, through every
    change of membership: after a failed collective (HorovodInternalError) the state is restored
    to its last commit, after HostsUpdatedInterrupt it is kept; either way the collectives join
    the next membership and every rank gets rank 0's state (``sync``) before ``func`` runs again.
    A worker the launcher removes (its host left the discovery script's output) ends with exit
    code 0."""

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        try:
            if not ops.is_initialized():
                ops.init()
            skip_sync = False
            while True:
                try:
                    if not skip_sync:
                        state.sync()
                    return func(state, *args, **kwargs)
                except HorovodInternalError:
                    state._roll_back()
                    skip_sync = False
                except HostsUpdatedInterrupt as e:
                    skip_sync = e.skip_sync
                _join_again(state)
        except RemovedFromJob as e:
            print("dtrain: %s; exiting" % e, file=sys.stderr, flush=True)
            sys.exit(0)

    return wrapper  # type: ignore[return-value]
