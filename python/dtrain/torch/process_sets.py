"""Horovod's process sets: collectives among some of the job's ranks.

    even = hvd.ProcessSet([0, 2])
    hvd.init(process_sets=[even])               # or later, on every rank: hvd.add_process_set
    if even.included():
        hvd.allreduce(t, process_set=even)      # among ranks 0 and 2 only

Each set has its own negotiation and its own Gloo or MPI communicator in dtrain's engine, so
collectives on different sets run at the same time, and names are each set's own. Ranks within a
set are counted in ascending order of the job's ranks (an allgather's blocks come in that order);
a broadcast's root_rank is a rank of the job, as in Horovod. Adding and removing sets are
collectives of the whole job: every rank calls them in the same order with the same ranks.
Sets may be added at any time (Horovod asks for HOROVOD_DYNAMIC_PROCESS_SETS=1; dtrain always
allows it). CUDA tensors in a set go through host memory (NCCL serves the whole job only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import _dtrain
from ..errors import InvalidArgument

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["ProcessSet", "global_process_set", "add_process_set", "remove_process_set"]


class ProcessSet:
    """A set of the job's ranks that run collectives together. Made from a list of ranks (or an
    mpi4py communicator under mpirun), then registered by ``init(process_sets=[...])`` or
    ``add_process_set``, which set ``process_set_id``."""

    process_set_id: int | None = None
    ranks: list[int] | None = None
    mpi_comm: Any = None

    def __init__(self, ranks_or_comm: Sequence[int] | Any) -> None:
        if hasattr(ranks_or_comm, "Get_group"):  # an mpi4py communicator
            from mpi4py import MPI  # type: ignore[import-not-found]
            group = ranks_or_comm.Get_group()
            world = MPI.COMM_WORLD.Get_group()
            self.ranks = sorted(MPI.Group.Translate_ranks(group, list(range(group.Get_size())),
                                                          world))
            self.mpi_comm = ranks_or_comm
            return
        try:
            ranks = sorted(ranks_or_comm)
        except TypeError:
            raise ValueError("ProcessSet should be initialized with a list of process ranks or "
                             "an mpi4py Comm object, not %r" % (ranks_or_comm,)) from None
        if any(isinstance(r, bool) or not isinstance(r, int) for r in ranks):
            raise ValueError("ProcessSet should be initialized with a list of process ranks "
                             "(ints), not %r" % (ranks_or_comm,))
        self.ranks = ranks

    def _registered(self) -> int | None:
        if self.process_set_id is not None and not _dtrain.collectives_is_initialized():
            return None
        return self.process_set_id

    def size(self) -> int | None:
        """How many ranks the set has; None until it is registered."""
        pid = self._registered()
        return None if pid is None else _set_size(pid)

    def rank(self) -> int | None:
        """This process's rank within the set (the order of an allgather's blocks); None until
        the set is registered. InvalidArgument (a ValueError) on a rank that is not a member."""
        pid = self._registered()
        return None if pid is None else _set_rank(pid)

    def included(self) -> bool | None:
        """Whether this process is a member; None until the set is registered."""
        pid = self._registered()
        if pid is None:
            return None
        return _dtrain.collectives_rank() in _dtrain.process_set_ranks(pid)

    def invalidate(self) -> None:
        self.process_set_id = None

    def __str__(self) -> str:
        return "ProcessSet(process_set_id=%s, ranks=%s, mpi_comm=%s)" % (
            self.process_set_id, self.ranks, self.mpi_comm)

    __repr__ = __str__


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0

# Every registered ProcessSet object by id: removing a set invalidates all objects naming it.
_registered: dict[int, list[ProcessSet]] = {0: [global_process_set]}


def _register(process_set: ProcessSet, pid: int) -> ProcessSet:
    process_set.process_set_id = pid
    if pid == 0:
        process_set.ranks = list(range(_dtrain.collectives_size()))
    known = _registered.setdefault(pid, [])
    if process_set not in known:
        known.append(process_set)
    return process_set


def add_process_set(process_set: ProcessSet | Sequence[int]) -> ProcessSet:
    """Registers a set of ranks (a ProcessSet, or a list of ranks) and returns its ProcessSet. A
    collective of the whole job: every rank calls it with the same ranks, in the same order as
    its other add/remove calls. InvalidArgument (on every rank) when they differ, when a rank is
    not one of the job's, or when a set of those ranks exists."""
    if not _dtrain.collectives_is_initialized():
        raise ValueError("dtrain.torch has not been initialized; call init() first")
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.process_set_id is not None:
        raise ValueError("%s is registered already" % process_set)
    assert process_set.ranks is not None
    return _register(process_set, _dtrain.add_process_set(process_set.ranks))


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregisters a set (a collective of the whole job) and invalidates every ProcessSet naming
    it; returns whether it was registered. The global set is never removed (False)."""
    pid = process_set.process_set_id
    if pid is None or pid == 0:
        return False
    removed = _dtrain.remove_process_set(pid)
    for known in _registered.pop(pid, []):
        known.invalidate()
    process_set.invalidate()
    return removed


def _init_sets(process_sets: object) -> None:
    """init(process_sets=...): "dynamic" (sets added later; always allowed) or the ProcessSets
    to register now, in order, on every rank (the whole job's ranks are the global set, id 0)."""
    _register(global_process_set, 0)
    if process_sets is None or process_sets == "dynamic":
        return
    if isinstance(process_sets, (str, bytes)):
        raise ValueError("init(process_sets=...) takes a list of ProcessSets or 'dynamic', "
                         "not %r" % (process_sets,))
    for ps in _as_list(process_sets):
        if not isinstance(ps, ProcessSet):
            raise ValueError("init(process_sets=...): %r is not a ProcessSet" % (ps,))
        if ps.ranks == list(range(_dtrain.collectives_size())):
            _register(ps, 0)
        elif ps.process_set_id is None:
            add_process_set(ps)


def _as_list(items: object) -> list[Any]:
    try:
        return list(items)  # type: ignore[call-overload]
    except TypeError:
        raise ValueError("init(process_sets=...) takes a list of ProcessSets, not %r"
                         % (items,)) from None


def _forget_sets() -> None:
    """At shutdown: the engine's sets are gone; the ProcessSet objects say so."""
    for pid in [p for p in _registered if p != 0]:
        for known in _registered.pop(pid):
            known.invalidate()


def _set_id(process_set: object) -> int:
    """The engine's id of `process_set` (None: the global set)."""
    if process_set is None:
        return 0
    if not isinstance(process_set, ProcessSet):
        raise TypeError("process_set= takes a ProcessSet, not %s" % type(process_set).__name__)
    if process_set.process_set_id is None:
        raise InvalidArgument("%s is not registered: pass it to init(process_sets=[...]) or "
                              "add_process_set first" % process_set)
    return process_set.process_set_id


def _members(pid: int) -> list[int]:
    return _dtrain.process_set_ranks(pid)


def _set_rank(pid: int) -> int:
    """This rank's place in set `pid` (InvalidArgument when it is not a member)."""
    members = _members(pid)
    me = _dtrain.collectives_rank()
    if me not in members:
        raise InvalidArgument("rank %d is not a member of process set %d (ranks %s)"
                              % (me, pid, members))
    return members.index(me)


def _set_size(pid: int) -> int:
    return len(_members(pid)) if pid else _dtrain.collectives_size()


def _root_in_set(pid: int, root_rank: int) -> int:
    """A broadcast root (a rank of the job) as the set's rank."""
    if pid == 0:
        return int(root_rank)
    members = _members(pid)
    if root_rank not in members:
        raise InvalidArgument("broadcast root rank %s is not a member of process set %d "
                              "(ranks %s)" % (root_rank, pid, members))
    return members.index(root_rank)
