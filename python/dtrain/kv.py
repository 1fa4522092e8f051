"""MXNet's KVStore on torch tensors: ``dtrain.kv.create('dist_sync')``.

Types: ``local`` and ``device`` (one process; ``device`` sums CUDA tensors on their GPU or, with
compression, compresses each there),
``dist_sync``, ``dist_async``, ``dist_sync_device``, ``dist_async_device`` (parameter servers;
``dist`` means ``dist_sync``), and ``horovod`` (allreduce among the workers, no servers).

Calls return at once so that communication overlaps computation: ``push``, ``pull`` (with
``out``), ``pushpull`` and ``broadcast`` return a :class:`Handle`; ``handle.wait()`` or
:func:`waitall` waits. A tensor passed as ``out`` is written when the call is done, and a tensor
passed as a value must not be changed before then. CPU tensors cross into the core without copies;
CUDA tensors (where dtrain was built with CUDA) are read after the work queued on torch's current
stream and staged through pinned host memory, except where the store keeps the key on the GPU as
MXNet's does (a ``device`` store's sum without compression, a ``local`` store's single GPU value,
and their optimizer's updates of those: a model-sized copy in that GPU's memory);
``dist_*_device`` stores first sum a key's values on the GPU. Tensors must be contiguous, of
float32, float64, float16 or bfloat16.

Keys are ints in ``[0, 2**43)`` or strs; every worker must init the same keys. A value is a tensor,
or a list of tensors from several local devices (summed before they leave the worker). A key may
be a list of keys, with one value (tensor or list) per key. A sparse COO value (an embedding's
gradient, torch's form of MXNet's ``row_sparse``) and ``row_sparse_pull`` move only the rows
concerned in dist stores (CPU tensors whose sparse indices run along the first dimension, as
``nn.Embedding(sparse=True)`` gives; the servers then update only those rows unless the
optimizer's ``lazy_update`` is 0); elsewhere a sparse value is pushed as its dense form and the
whole value is pulled.

Errors: misuse raises :class:`dtrain.InvalidArgument` (a ``ValueError``) naming the key at the
call; a failure on the way raises :class:`dtrain.PeerError` or :class:`dtrain.TimeoutError`,
naming the node, from ``wait``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, overload

import torch

from . import _dtrain, _lifetime
from .errors import InvalidArgument
from .optimizer import Optimizer

if TYPE_CHECKING:
    import os
    from collections.abc import Sequence
    from typing import Self, TypeAlias

    _Key: TypeAlias = int | str
    # Several keys: a list or a tuple (of ints, of strs, or of both).
    _KeyList: TypeAlias = list[int] | list[str] | list[int | str] | tuple[int | str, ...]
    # A tensor, or one per local device; for several keys, one of those per key.
    _Value: TypeAlias = torch.Tensor | Sequence[torch.Tensor | Sequence[torch.Tensor]]
    _Path: TypeAlias = str | os.PathLike[str]

__all__ = ["create", "KVStore", "Handle", "waitall"]


def create(name: str = "local") -> KVStore:
    """A new KVStore of type `name`. A dist type joins the job described by the DMLC_*
    variables (and blocks until every node has joined)."""
    if not isinstance(name, str):
        raise TypeError("the kvstore type is a str, e.g. 'dist_sync'")
    return KVStore(name)


def waitall() -> None:
    """Waits for every call issued so far on every open KVStore."""
    for store in list(_lifetime._live[_lifetime.STORE]):
        store._waitall()


class Handle:
    """A call in flight. ``wait()`` blocks until it is done, raises its error, and returns the
    pulled tensor(s) for a pull or pushpull (None for a push)."""

    __slots__ = ("_op", "_result")

    def __init__(self, op: _dtrain.Operation, result: Any = None) -> None:
        self._op = op
        self._result = result

    def wait(self) -> Any:  # None for a push, else the tensor(s) that the call wrote
        self._op.wait()
        return self._result

    @property
    def done(self) -> bool:
        return self._op.done


class _AllOf:
    """Several calls as one: done when all are (a push of sparse and dense keys together)."""

    __slots__ = ("_ops",)

    def __init__(self, ops: list[_dtrain.Operation]) -> None:
        self._ops = ops

    def wait(self) -> None:
        for op in self._ops:
            op.wait()

    @property
    def done(self) -> bool:
        return all(op.done for op in self._ops)


def _row_sparse(tensors: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A sparse value's row ids and rows (the devices' together: the store sums repeats), when
    every tensor is a CPU sparse COO tensor with indices along its first dimension only (an
    embedding's gradient); None otherwise (the value travels dense)."""
    if not all(t.is_sparse and t.device.type == "cpu" and t.dim() >= 2 and t.sparse_dim() == 1
               for t in tensors):
        return None
    rows = torch.cat([t._indices()[0] for t in tensors])
    values = torch.cat([t._values() for t in tensors]).contiguous()
    return rows, values


def _is_tensor(x: object) -> bool:
    return isinstance(x, torch.Tensor)


def _keys(key: _Key | _KeyList) -> tuple[list[_Key], bool]:
    """(list of keys, whether a list was given)."""
    if isinstance(key, (list, tuple)):
        if not key:
            raise InvalidArgument("an empty list of keys")
        return list(key), True
    return [key], False


def _devices(value: Any, what: str, key: _Key) -> list[torch.Tensor]:
    if _is_tensor(value):
        return [value]
    if isinstance(value, (list, tuple)) and value and all(_is_tensor(v) for v in value):
        return list(value)
    raise TypeError("%s of key %r must be a tensor or a non-empty list of tensors (one per device), "
                    "not %s" % (what, key, type(value).__name__))


def _densified(per_key: list[list[torch.Tensor]]) -> list[list[torch.Tensor]]:
    """Sparse values (an embedding's gradient, torch's form of MXNet's row_sparse) as dense ones:
    the stores sum dense values, and the sum of sparse values is the sum of their dense forms."""
    return [[t.to_dense() if t.is_sparse else t for t in tensors] for tensors in per_key]


def _row_ids(row_ids: Any, key: _Key, rows: int, device: torch.device) -> torch.Tensor:
    """`row_ids` as sorted unique int64 row numbers on `device`, each checked against `rows`."""
    if not _is_tensor(row_ids):
        try:
            row_ids = torch.as_tensor(row_ids)
        except (TypeError, ValueError, RuntimeError) as e:
            raise InvalidArgument("row_sparse_pull of key %r: row_ids must be a tensor or a "
                                  "list of ints (%s)" % (key, e)) from None
        if row_ids.numel() == 0:  # [] reads as float32
            row_ids = row_ids.to(torch.int64)
    if row_ids.is_floating_point() or row_ids.is_complex() or row_ids.dtype == torch.bool:
        raise InvalidArgument("row_sparse_pull of key %r: row_ids must be integers, not %s"
                              % (key, row_ids.dtype))
    ids = torch.unique(row_ids.reshape(-1).to(device=device, dtype=torch.int64))
    if ids.numel() and (int(ids[0]) < 0 or int(ids[-1]) >= rows):
        bad = int(ids[0]) if int(ids[0]) < 0 else int(ids[-1])
        raise InvalidArgument("row_sparse_pull of key %r: row id %d is outside the key's %d rows"
                              % (key, bad, rows))
    return ids


def _per_key(keys: list[_Key], listed: bool, value: Any,
             what: str) -> list[list[torch.Tensor]]:
    """One list of tensors per key."""
    if not listed:
        return [_devices(value, what, keys[0])]
    if not isinstance(value, (list, tuple)) or len(value) != len(keys):
        raise InvalidArgument("%d keys need %d %ss (a tensor or a list of tensors per key), got %s"
                              % (len(keys), len(keys), what,
                                 "%d" % len(value) if isinstance(value, (list, tuple))
                                 else "a %s" % type(value).__name__))
    return [_devices(v, what, k) for k, v in zip(keys, value)]


class KVStore:
    """A key-value store of tensors, shared by the workers of a job (see the module's help)."""

    def __init__(self, name: str) -> None:
        self._h = _dtrain.KVStore(name)
        # key -> (shape, dtype) of its init value, to allocate pull outputs
        self._shapes: dict[_Key, tuple[torch.Size, torch.dtype]] = {}
        self._closed = False
        _lifetime.register(self, _lifetime.STORE)

    # --- properties ---
    @property
    def type(self) -> str:
        """The store's type, e.g. ``'dist_sync'``."""
        return self._h.type

    @property
    def rank(self) -> int:
        """This worker's rank, 0 to num_workers - 1."""
        return self._h.rank

    @property
    def num_workers(self) -> int:
        """The number of workers in the job (1 for local stores)."""
        return self._h.num_workers

    @property
    def rejoined(self) -> bool:
        """True in a process that replaces a lost worker of a running job
        (``dtrain launch --max-restarts``): the keys and the servers' optimizer
        are the job's already, so ``init`` and ``set_optimizer`` only record them."""
        return self._h.rejoined

    @property
    def rounds_done(self) -> int:
        """The steps (rounds that push every key once) this worker's rank had
        completed when this process joined: 0, except in a replacement, which
        resumes there. Skip that many batches of this worker's data, e.g.
        ``for step, batch in enumerate(loader): if step < kv.rounds_done: continue``."""
        return self._h.rounds_done

    # --- data ---
    def init(self, key: _Key | _KeyList, value: _Value) -> None:
        """Creates each key with an initial value. In dist stores rank 0's value is kept; the call
        returns when the keys exist for every worker."""
        keys, listed = _keys(key)
        values = [v[0] for v in _per_key(keys, listed, value, "value")]
        self._h.init(keys, values)
        for k, v in zip(keys, values):
            self._shapes[k] = (v.shape, v.dtype)

    def push(self, key: _Key | _KeyList, value: _Value, priority: int = 0) -> Handle:
        """Adds the value (summed over the devices given) to this round of the key."""
        keys, listed = _keys(key)
        values = self._shaped("push", keys, _per_key(keys, listed, value, "value"), "value")
        rows = [_row_sparse(v) for v in values] if self._moves_rows() else [None] * len(keys)
        if all(r is None for r in rows):
            return Handle(self._h.push(keys, _densified(values), priority))
        ops = [self._h.push_rows(k, r[0], r[1], priority)
               for k, r in zip(keys, rows) if r is not None]
        dense = [(k, v) for k, v, r in zip(keys, values, rows) if r is None]
        if dense:
            ops.append(self._h.push([k for k, _ in dense], _densified([v for _, v in dense]),
                                    priority))
        return Handle(_AllOf(ops))  # type: ignore[arg-type]

    @overload
    def pull(self, key: _Key, out: None = None, priority: int = 0,
             ignore_sparse: bool = True) -> torch.Tensor: ...

    @overload
    def pull(self, key: _KeyList, out: None = None, priority: int = 0,
             ignore_sparse: bool = True) -> list[torch.Tensor]: ...

    @overload
    def pull(self, key: _Key | _KeyList, out: _Value, priority: int = 0,
             ignore_sparse: bool = True) -> Handle: ...

    def pull(self, key: _Key | _KeyList, out: _Value | None = None, priority: int = 0,
             ignore_sparse: bool = True) -> torch.Tensor | list[torch.Tensor] | Handle:
        """Copies the key's current value into `out` (a tensor, or a list of tensors: one per
        device) and returns a Handle. Without `out`, waits and returns new tensors."""
        keys, listed = _keys(key)
        if out is None:
            fresh = [self._new_like(k) for k in keys]
            self._h.pull(keys, [[t] for t in fresh], priority).wait()
            return fresh if listed else fresh[0]
        outs = self._shaped("pull", keys, _per_key(keys, listed, out, "out"), "out")
        return Handle(self._h.pull(keys, outs, priority), out)

    def pushpull(self, key: _Key | _KeyList, value: _Value, out: _Value | None = None,
                 priority: int = 0) -> Handle:
        """Push, then pull the resulting value, in one exchange. Without `out` the result is
        written into `value`."""
        keys, listed = _keys(key)
        values = self._shaped("pushpull", keys, _per_key(keys, listed, value, "value"), "value")
        if out is None and any(t.is_sparse for tensors in values for t in tensors):
            raise InvalidArgument("pushpull of a sparse value of key %r: pass out (a dense "
                                  "tensor) for the result" % (keys[0],))
        outs = values if out is None else \
            self._shaped("pushpull", keys, _per_key(keys, listed, out, "out"), "out")
        result = value if out is None else out
        return Handle(self._h.pushpull(keys, _densified(values), outs, priority), result)

    def broadcast(self, key: _Key | _KeyList, value: _Value, out: _Value,
                  priority: int = 0) -> Handle:
        """Init the key with rank 0's `value`, then pull it into `out` on every worker."""
        self.init(key, value)
        return self.pull(key, out=out, priority=priority)

    def row_sparse_pull(self, key: _Key | _KeyList, out: Any = None, priority: int = 0,
                        row_ids: Any = None) -> Any:
        """MXNet's row_sparse_pull: the rows `row_ids` (a tensor or list of ints; repeats and
        order do not matter) of a key whose value is a matrix, such as an embedding's weights.

        Without `out`, waits and returns a sparse COO tensor of the key's shape holding those rows
        (torch's form of MXNet's RowSparseNDArray: what ``nn.Embedding(sparse=True)`` gives as a
        gradient). With `out` (a dense tensor of the key's shape, or one per device), writes those
        rows and zeros elsewhere, as MXNet's row_sparse `out`, and returns a Handle that is done;
        with one out per device, `row_ids` may be one per device too, as in MXNet. For several
        keys, pass one `row_ids` per key. Row ids are checked before anything is written. In a
        dist store only those rows travel (CPU tensors); elsewhere the whole value does."""
        keys, listed = _keys(key)
        if row_ids is None:
            raise InvalidArgument("row_sparse_pull of key %r needs row_ids" % (keys[0],))
        if listed and (not isinstance(row_ids, (list, tuple)) or len(row_ids) != len(keys)):
            raise InvalidArgument("row_sparse_pull of %d keys needs one row_ids per key"
                                  % len(keys))
        ids_per_key = list(row_ids) if listed else [row_ids]
        outs = None if out is None else self._shaped(
            "row_sparse_pull", keys, _per_key(keys, listed, out, "out"), "out")
        # Every key's ids, checked against its rows before anything is pulled or written.
        plans = []
        for i, k in enumerate(keys):
            targets = None if outs is None else outs[i]
            if targets is None and k not in self._shapes:
                raise InvalidArgument("row_sparse_pull of key %r without out: the key was never "
                                      "initialised here (call init first, or pass out)" % (k,))
            shape = targets[0].shape if targets is not None else self._shapes[k][0]
            if len(shape) < 1 or shape[0] == 0:
                raise InvalidArgument("row_sparse_pull of key %r: its value of shape %s has no "
                                      "rows" % (k, tuple(shape)))
            given = ids_per_key[i]
            per_device = (targets is not None and len(targets) > 1
                          and isinstance(given, (list, tuple)) and len(given) == len(targets)
                          and all(_is_tensor(g) or isinstance(g, (list, tuple)) for g in given))
            # Without out the rows land in a new tensor on the CPU.
            dtype = targets[0].dtype if targets is not None else self._shapes[k][1]
            devices = ([t.device for t in targets] if targets is not None
                       else [torch.device("cpu")])
            ids = [_row_ids(given[j] if per_device else given, k, shape[0], devices[j])
                   for j in range(len(devices))]
            plans.append((k, targets, ids, tuple(shape), dtype))
        results = []
        op = None
        for k, targets, ids, dims, dtype in plans:
            if self._moves_rows() and len(dims) >= 2 and all(i.device.type == "cpu"
                                                              for i in ids):
                # Only the rows asked for travel: their union, then each device's share.
                union = torch.unique(torch.cat(ids))
                got = torch.empty((union.numel(),) + dims[1:], dtype=dtype)
                op = self._h.pull_rows(k, union, got, priority)
                op.wait()
                rows = [got.index_select(0, torch.searchsorted(union, device_ids))
                        for device_ids in ids]
            else:
                full = self._new_like(k) if targets is None else targets[0]
                op = self._h.pull([k], [[full]], priority)
                op.wait()
                rows = [full.index_select(0, device_ids.to(full.device)) for device_ids in ids]
            if targets is None:
                results.append(torch.sparse_coo_tensor(ids[0].unsqueeze(0), rows[0],
                                                       dims).coalesce())
                continue
            for t, device_ids, kept in zip(targets, ids, rows):
                t.zero_()
                t.index_copy_(0, device_ids, kept.to(t.device))
        if op is None or outs is None:
            return results if listed else results[0]
        return Handle(op, out)

    def _moves_rows(self) -> bool:
        """Whether sparse values move as rows: dist stores."""
        return self.type.startswith("dist")

    # --- control ---
    def barrier(self) -> None:
        """Blocks until every worker has reached the barrier."""
        self._h.barrier()

    _barrier = barrier  # MXNet's name

    def set_optimizer(self, optimizer: Optimizer) -> None:
        """From now on pushes are applied with `optimizer` (a dtrain.optimizer.Optimizer) on the
        store's side (on the servers for dist stores) and pulls return weights."""
        if not isinstance(optimizer, Optimizer):
            raise TypeError("set_optimizer takes a dtrain.optimizer.Optimizer, e.g. "
                            "dtrain.optimizer.create('sgd', learning_rate=0.1)")
        self._h.set_optimizer(*optimizer._spec())

    def set_gradient_compression(self, compression_params: dict[str, Any]) -> None:
        """Compresses what this worker pushes, as MXNet does: ``{'type': '2bit', 'threshold':
        0.5}``, ``{'type': '1bit', 'threshold': 0}`` (both with error feedback: what is not sent
        is kept and added to the next push), ``{'type': 'fp16'}`` or ``{'type': 'none'}``. Dist
        stores compress pushes to the servers (after summing local devices); local and device
        stores compress each device's value when a push sums several. Pulls and init values
        travel uncompressed. ``'min_elements': N`` (dtrain's) sends keys of fewer than N values
        uncompressed (default 0: every key, as MXNet). Call it before the first push; float32
        keys only."""
        if not isinstance(compression_params, dict):
            raise TypeError("compression_params is a dict, e.g. {'type': '2bit', 'threshold': 0.5}")
        self._h.set_gradient_compression({str(k): str(v) for k, v in compression_params.items()})

    def save_optimizer_states(self, fname: _Path, dump_optimizer: bool = False) -> None:
        """Saves the state of the store's optimizer (all servers' for dist stores) to `fname`."""
        state = self._h.save_optimizer_state()
        with open(fname, "wb") as f:
            f.write(state)

    def load_optimizer_states(self, fname: _Path) -> None:
        """Restores a state saved by save_optimizer_states into a store of the same layout. Call
        it on every worker: rank 0 restores the servers and the others wait for it."""
        with open(fname, "rb") as f:
            state = f.read()
        dist = self.type.startswith("dist")
        if not dist or self.rank == 0:
            self._h.load_optimizer_state(state)
        if dist:
            self.barrier()

    # --- lifetime ---
    def close(self) -> None:
        """Waits for the calls in flight and, for dist stores, leaves the job (the scheduler ends
        the job once every worker has left). Also done at exit."""
        self._closed = True
        self._h.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _waitall(self) -> None:
        if not self._closed:
            self._h.waitall()

    def _shaped(self, call: str, keys: list[_Key], per_key: list[list[torch.Tensor]],
                what: str) -> list[list[torch.Tensor]]:
        """`per_key` after checking each tensor's shape against its key's init value, as MXNet
        does (the C++ store checks the element count and dtype; a key initialised by another
        process has no shape here and is checked there only)."""
        for key, tensors in zip(keys, per_key):
            known = self._shapes.get(key)
            if known is None:
                continue
            for i, t in enumerate(tensors):
                if t.shape != known[0]:
                    raise InvalidArgument(
                        "%s of key %r: %s %d has shape %s, but the key was initialised with "
                        "shape %s" % (call, key, what, i, tuple(t.shape), tuple(known[0])))
        return per_key

    def _new_like(self, key: _Key) -> torch.Tensor:
        if key not in self._shapes:
            raise InvalidArgument("pull of key %r without out: the key was never initialised here "
                                  "(call init first, or pass out)" % (key,))
        shape, dtype = self._shapes[key]
        return torch.empty(shape, dtype=dtype)
