"""Horovod's collective operations on torch tensors (``horovod.torch.mpi_ops``), run by dtrain's
C++ collectives engine over Gloo (``dtrain launch -n N -s 0``) or OpenMPI (``mpirun -np N``).

Asynchronous calls return an int handle; ``synchronize(handle)`` waits and returns the output,
``poll(handle)`` says whether it is done. Collectives are matched across ranks by name, so ranks
may submit them in different orders; unnamed ones are numbered in submission order, which must
then be the same on every rank.

Float tensors (float32, float64, float16, bfloat16) are reduced as they are, and scaled (prescale,
postscale, an average's 1 / size) in Horovod's arithmetic, so results equal Horovod's bit for bit:
float16 and bfloat16 on the host in float32. Integer and bool tensors are reduced exactly in
float64 (up to 2^53); their prescale factor applies on each rank and their average and postscale
factor after the sum, each cast back toward zero, as Horovod does;
allgather, broadcast and alltoall move any dtype's bytes unchanged. CUDA tensors go over NCCL where
dtrain was built with it (HOROVOD_GPU_OPERATIONS=NCCL, one GPU per rank), else through host memory
(alltoall, reducescatter and Adasum always stage through host memory).
HOROVOD_HIERARCHICAL_ALLREDUCE=1 makes NCCL allreduces hierarchical, as Horovod's: within each host
over NCCL, across hosts in host memory over Gloo or MPI.

op=Adasum (adaptive summation, the engine's src/collectives/adasum.h) takes float tensors
(bfloat16 in float32) and a power-of-two number of ranks, in any process set; CUDA tensors are
combined over all ranks as host tensors are (Horovod's GPU path instead averages within each host
first).

The synchronous, differentiable forms (allreduce, allgather, broadcast, alltoall, reducescatter
and the grouped ones) are in autograd.py; alltoall and reducescatter in scatter_ops.py.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import pickle
from typing import TYPE_CHECKING, Any

import torch

from .. import _dtrain
from . import _memory
from ..errors import HorovodInternalError, InvalidArgument
from .process_sets import (
    _forget_sets, _init_sets, _root_in_set, _set_id, _set_size,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "cross_rank", "cross_size", "mpi_enabled", "gloo_enabled", "mpi_built", "gloo_built",
    "nccl_built", "cuda_built", "rocm_built", "ccl_built", "ddl_built", "mpi_threads_supported",
    "is_homogeneous", "start_timeline", "stop_timeline",
    "HorovodInternalError",
    "Average", "Sum", "Adasum", "Min", "Max", "Product",
    "allreduce_", "allreduce_async", "allreduce_async_",
    "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
    "allgather_async", "broadcast_", "broadcast_async",
    "broadcast_async_", "synchronize", "poll", "join", "barrier",
    "broadcast_object", "allgather_object",
]

# Reduction ops, as Horovod numbers them, and the engine's name for each.
Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5
_ENGINE_OPS = {Average: "average", Sum: "sum", Adasum: "adasum", Min: "min", Max: "max",
               Product: "product"}

_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


# --- process layout ---------------------------------------------------------------------------

def init(comm: object = None, process_sets: object = None) -> None:
    """Starts the collectives: the backend and layout come from the environment (mpirun's, or
    dtrain launch's DMLC_* variables for Gloo). `process_sets`: ProcessSets to register now, in
    the same order on every rank (process_sets.py), or "dynamic". Calling it again does
    nothing."""
    if comm is not None:
        raise NotImplementedError("init(comm=...): dtrain runs on the whole job (MPI_COMM_WORLD); "
                                  "use process sets for collectives among some ranks")
    _dtrain.collectives_init()
    _init_sets(process_sets)


def shutdown() -> None:
    """Stops the collectives (waits for what is in flight); also done at exit."""
    _forget_sets()
    _dtrain.collectives_shutdown()
    # A later init() (an elastic job's reset) starts a new job for the names: every rank, new
    # ones included, numbers its unnamed collectives from 0 again.
    _handles.clear()
    _unsynchronized.clear()
    _unnamed.clear()


def is_initialized() -> bool:
    return _dtrain.collectives_is_initialized()


def _initialized() -> None:
    if not _dtrain.collectives_is_initialized():
        raise ValueError("dtrain.torch has not been initialized; call init() first")


def rank() -> int:
    _initialized()
    return _dtrain.collectives_rank()


def size() -> int:
    _initialized()
    return _dtrain.collectives_size()


def local_rank() -> int:
    _initialized()
    return _dtrain.collectives_local_rank()


def local_size() -> int:
    _initialized()
    return _dtrain.collectives_local_size()


def cross_rank() -> int:
    """Which host this rank is on, counting hosts by their first rank (assumes the same number of
    ranks per host, as Horovod's does)."""
    return rank() // local_size()


def cross_size() -> int:
    return size() // local_size()


def is_homogeneous() -> bool:
    """Whether every host runs the same number of ranks."""
    _initialized()
    return len(set(allgather_object(local_size()))) == 1


def mpi_enabled() -> bool:
    return is_initialized() and _dtrain.collectives_backend() == "mpi"


def gloo_enabled() -> bool:
    return is_initialized() and _dtrain.collectives_backend() == "gloo"


def mpi_built() -> bool:
    return _dtrain.mpi_built()


def gloo_built() -> bool:
    return True


def nccl_built() -> int:
    """Horovod's: the NCCL version dtrain was compiled against, as NCCL_VERSION_CODE (e.g. 22803
    for 2.28.3), or 0 without NCCL. Scripts compare it (``nccl_built() >= 2700``)."""
    return int(_dtrain.nccl_version())


def cuda_built() -> bool:
    return _dtrain.cuda_built()


def rocm_built() -> bool:
    return False


def ccl_built() -> bool:
    """oneCCL (Intel's collectives): not in dtrain; CPU tensors go over Gloo or MPI."""
    return False


def ddl_built() -> bool:
    """IBM's DDL: not in dtrain."""
    return False


def mpi_threads_supported() -> bool:
    return mpi_enabled()


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Records this rank's timeline (Chrome's trace format: the engine's negotiation rounds and
    collectives, the training steps) from now until stop_timeline or exit. Rank 0 writes
    `file_path`, rank r `file_path`.rank-r.json. `mark_cycles` is accepted for Horovod's scripts:
    the engine's rounds are always there, as "negotiate" spans. InvalidArgument when a timeline
    is on already (DTRAIN_TIMELINE / HOROVOD_TIMELINE, or an earlier start)."""
    _initialized()
    r = rank()
    _dtrain.timeline_start(file_path if r == 0 else "%s.rank-%d.json" % (file_path, r))


def stop_timeline() -> None:
    """Writes the timeline start_timeline began (nothing if none was)."""
    _dtrain.timeline_stop()


# --- handles ----------------------------------------------------------------------------------

# handle -> the op in flight, the function giving its output, and its (process set, name)
_Pending = collections.namedtuple("_Pending", "op finish key", defaults=(None,))
_handles: dict[int, _Pending] = {}
# (process set, name) -> (op, _waits when submitted) of every collective not yet synchronized. Horovod
# refuses a second collective of a name while the first is in flight. The engine's own check ends
# when the first finishes, which, when the other ranks were waiting for it, can be within
# microseconds, before this caller submits the second: whether the second were refused would
# depend on timing (Horovod's queue holds every collective for a cycle, so two calls in a row
# always meet). Here the first counts as in flight until synchronized, or until it is done and
# this process has waited for something since (synchronize, barrier): a handle the caller dropped
# frees its name at the caller's next wait. The engine hears of each such refusal and passes it
# on, so the other ranks' second collective of the name fails too (engine.h, Engine::Refuse).
_unsynchronized: dict[tuple[int, str], tuple[Any, int]] = {}
_waits = 0  # synchronize and barrier calls so far
_next_handle = itertools.count()
# Unnamed collectives are numbered per kind and per process set: ranks outside a set do not count
# its collectives, and must still agree on the names of the others.
_unnamed: collections.defaultdict[tuple[str, int], itertools.count[int]] = \
    collections.defaultdict(itertools.count)


def _name(kind: str, name: str | None, pid: int = 0) -> str:
    if name is None:
        return "%s.noname.%d" % (kind, next(_unnamed[(kind, pid)]))
    if not isinstance(name, str) or not name:
        raise TypeError("a collective's name is a non-empty str")
    first = _unsynchronized.get((pid, name))
    if first is not None and (not first[0].done or first[1] == _waits):
        _dtrain.refuse_collective(name, pid)  # the other ranks' second fails too
        raise InvalidArgument("%s '%s': a collective of this name is already in flight (submitted "
                              "and not yet synchronized; names must be unique among the "
                              "collectives in flight)" % (kind, name))
    return name


def _handle(op: _dtrain.CollectiveHandle | _AllOf, finish: Callable[[], Any],
            key: tuple[int, str] | None = None) -> int:
    """A handle for `op`; `key` (process set, name) stays taken until synchronize."""
    h = next(_next_handle)
    _handles[h] = _Pending(op, finish, key)
    if key is not None:
        _unsynchronized[key] = (op, _waits)
    return h


def _take(handle: int) -> _Pending:
    """Removes `handle` (synchronized): its name is free again."""
    pending = _handles.pop(handle)
    if pending.key is not None and _unsynchronized.get(pending.key, (None,))[0] is pending.op:
        del _unsynchronized[pending.key]
    return pending


def _pending(handle: int) -> _Pending:
    try:
        return _handles[handle]
    except KeyError:
        raise ValueError("unknown handle %r (already synchronized?)" % (handle,)) from None


def poll(handle: int) -> bool:
    """True once the collective behind `handle` is done (synchronize will not block)."""
    return _pending(handle).op.done


def synchronize(handle: int) -> Any:
    """Waits for the collective behind `handle` and returns its output; raises its error
    (PeerError naming a rank that left, TimeoutError past DTRAIN_COLLECTIVE_TIMEOUT_MS)."""
    global _waits
    pending = _pending(handle)
    _waits += 1
    try:
        pending.op.wait()
    finally:
        _take(handle)
    return pending.finish()


# --- CUDA tensors ---------------------------------------------------------------------------------

def _on_host(t: torch.Tensor) -> torch.Tensor:
    """`t`, or its copy in host memory if it is a CUDA tensor: the engine reduces host buffers
    over Gloo or OpenMPI (Horovod's host staging when NCCL is not used), and the result is copied
    back into the CUDA output when the collective finishes. The copy waits for the work queued on
    torch's current stream, as Horovod's does."""
    return t.cpu() if t.is_cuda else t


def _engine_takes(t: torch.Tensor, pid: int = 0) -> bool:
    """Whether the engine takes `t` where it is: host tensors always, CUDA tensors when the job
    reduces them over NCCL (HOROVOD_GPU_OPERATIONS=NCCL, the default where NCCL is built; the
    engine's NCCL stream waits for torch's current stream) and `t` is for the global process
    set."""
    return not t.is_cuda or (pid == 0 and _dtrain.collectives_nccl_enabled())


def _for_engine(t: torch.Tensor, pid: int = 0) -> torch.Tensor:
    """`t` as the engine takes it: itself, or its copy in host memory."""
    return t if _engine_takes(t, pid) else _on_host(t)


# --- byte views for dtypes the engine does not reduce -------------------------------------------

def _as_rows(tensor: torch.Tensor) -> tuple[torch.Tensor,
                                           Callable[[torch.Tensor], torch.Tensor]]:
    """A contiguous float16 tensor holding `tensor`'s bytes, one row per entry of the first
    dimension (rows padded to an even number of bytes), and the function that turns such rows,
    gathered or broadcast, back into `tensor`'s dtype and trailing shape."""
    t = tensor.detach().contiguous()
    shape = tuple(t.shape) if t.dim() > 0 else (1,)
    rows, tail = shape[0], shape[1:]
    row_bytes = t.element_size() * int(torch.Size(tail).numel())
    raw = torch.empty(rows, row_bytes + row_bytes % 2, dtype=torch.uint8, device="cpu")
    if t.numel():
        # Through 1-d: a contiguous tensor may still have odd strides on its size-1 dimensions.
        raw[:, :row_bytes] = _on_host(t.reshape(-1).view(torch.uint8).reshape(rows, -1))
    if row_bytes % 2:
        raw[:, row_bytes:] = 0

    def back(wire: torch.Tensor) -> torch.Tensor:
        b = wire.contiguous().view(torch.uint8)[:, :row_bytes].contiguous()
        return b.view(t.dtype).reshape((wire.shape[0],) + tail)

    return raw.view(torch.float16), back


# --- allreduce --------------------------------------------------------------------------------

def _reduce_op(average: bool | None, op: int | None) -> int:
    if average is not None:
        if op is not None:
            raise ValueError("give op or the deprecated average, not both")
        return Average if average else Sum
    op = Average if op is None else op
    if op not in _ENGINE_OPS:
        raise ValueError("unknown reduction op %r (use dtrain.torch.Average, Sum, Adasum, Min, "
                         "Max or Product)" % (op,))
    return op


def _check_adasum(tensor: torch.Tensor, pid: int) -> None:
    """Refuses what Adasum cannot combine, in Horovod's words where it has them."""
    ranks = _set_size(pid)
    if ranks & (ranks - 1):
        raise NotImplementedError("Running Adasum with non-power of 2 ranks is not supported yet "
                                  "(%s has %d)" % ("this process set" if pid else "the job",
                                                   ranks))
    if tensor.dtype not in _FLOATS:
        raise InvalidArgument("op=Adasum combines float tensors (float16, bfloat16, float32, "
                              "float64), not %s" % tensor.dtype)


def _scaled(t: torch.Tensor, factor: float) -> torch.Tensor:
    """`t` * `factor` in Horovod's arithmetic for float tensors (its ScaleBuffer): the factor
    rounded to the tensor's type and the product rounded once; float16 and bfloat16 on the host in
    float32 (Horovod converts each element), on a GPU with the factor in the tensor's own type."""
    compute = t.dtype
    if t.dtype in (torch.float16, torch.bfloat16) and t.device.type == "cpu":
        compute = torch.float32
    f = torch.tensor(factor, dtype=torch.float64).to(compute).to(t.device)
    return (t.to(compute) * f).to(t.dtype)


def _reduction(tensor: torch.Tensor, op: int, prescale_factor: float,
               postscale_factor: float, pid: int = 0) -> tuple[torch.Tensor, str, Callable[[torch.Tensor],
                                                                             torch.Tensor]]:
    """How the engine reduces `tensor` by `op` (allreduce and reducescatter): the values it is
    given (contiguous, prescaled), the engine's op, and what turns the engine's result into the
    answer before the cast back to `tensor`'s dtype, all in Horovod's arithmetic (bit for bit).
    Float tensors are scaled as _scaled says; an average with a postscale factor is a sum scaled
    once by postscale / size, as Horovod folds the two. Integers and bools are exact in float64:
    the prescale on each rank's values, cast toward zero before the reduction; an average is a
    sum, then one factor (postscale / size) and a cast toward zero (-75 and 0 average to -37)."""
    if op == Adasum:
        _check_adasum(tensor, pid)
    exact = tensor.dtype in _FLOATS
    src = tensor.detach()
    if tensor.dtype == torch.bfloat16 and op == Adasum:
        src = src.float()  # the engine's Adasum takes Horovod's three float types
    if prescale_factor != 1.0:
        src = _scaled(src, prescale_factor) if exact else \
            (src.to(torch.float64) * prescale_factor).trunc()
    src = (src if exact else src.to(torch.float64)).contiguous()
    # The engine averages with one factor of 1 / size (Horovod's arithmetic too); a postscale
    # factor joins that factor instead of scaling the average a second time.
    fold = op == Average and (not exact or postscale_factor != 1.0)
    engine_op = "sum" if fold else _ENGINE_OPS[op]
    factor = postscale_factor / _set_size(pid) if fold else postscale_factor

    def after(result: torch.Tensor) -> torch.Tensor:
        if factor == 1.0:
            return result
        return _scaled(result, factor) if exact else (result * factor).trunc()

    return src, engine_op, after


def _allreduce_start(tensor: torch.Tensor, output: torch.Tensor, name: str | None, op: int,
                     prescale_factor: float, postscale_factor: float, pid: int) -> int:
    """Submits tensor -> output (same shape and dtype; may be the same tensor)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError("allreduce takes a tensor, not %s" % type(tensor).__name__)
    name = _name("allreduce", name, pid)
    src, engine_op, after = _reduction(tensor, op, prescale_factor, postscale_factor, pid)
    work = _on_host(src) if op == Adasum else _for_engine(src, pid)
    if output.is_contiguous() and output.dtype == work.dtype and output.device == work.device:
        into = output  # floats: straight into the output
    elif tensor.dtype in _FLOATS:
        into = _memory.empty_like(work)  # `work` may be the caller's input: it stays untouched
    else:
        into = work  # integers: their float64 copy is this call's own
    pending = _dtrain.allreduce_async(name, work, into, engine_op, pid)

    def finish() -> torch.Tensor:
        result = after(into).to(output.dtype)
        if result is not output:
            with torch.no_grad():
                output.copy_(result)
        return output

    return _handle(pending, finish, (pid, name))


def allreduce_async(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                    op: int | None = None, prescale_factor: float = 1.0,
                    postscale_factor: float = 1.0, process_set: object = None) -> int:
    """Starts reducing `tensor` over all ranks (average by default) into a new tensor."""
    _initialized()
    op = _reduce_op(average, op)
    output = _memory.empty_like(tensor)
    return _allreduce_start(tensor, output, name, op, prescale_factor, postscale_factor,
                            _set_id(process_set))


def allreduce_async_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                     op: int | None = None, prescale_factor: float = 1.0,
                     postscale_factor: float = 1.0, process_set: object = None) -> int:
    """Starts reducing `tensor` over all ranks, in place."""
    _initialized()
    op = _reduce_op(average, op)
    return _allreduce_start(tensor, tensor, name, op, prescale_factor, postscale_factor,
                            _set_id(process_set))


def allreduce_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
               op: int | None = None, prescale_factor: float = 1.0,
               postscale_factor: float = 1.0, process_set: object = None) -> torch.Tensor:
    """Reduces `tensor` over all ranks in place and returns it."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set))


def grouped_allreduce_async(tensors: Iterable[torch.Tensor], average: bool | None = None,
                            name: str | None = None, op: int | None = None,
                            **kwargs: Any) -> int:
    pid = _set_id(kwargs.get("process_set"))
    base = _name("grouped_allreduce", name, pid)
    with _submitted_together(pid):
        return _grouped([allreduce_async(t, average, "%s.%d" % (base, i), op, **kwargs)
                         for i, t in enumerate(tensors)])


def grouped_allreduce_async_(tensors: Iterable[torch.Tensor], average: bool | None = None,
                             name: str | None = None, op: int | None = None,
                             **kwargs: Any) -> int:
    pid = _set_id(kwargs.get("process_set"))
    base = _name("grouped_allreduce", name, pid)
    with _submitted_together(pid):
        return _grouped([allreduce_async_(t, average, "%s.%d" % (base, i), op, **kwargs)
                         for i, t in enumerate(tensors)])


def grouped_allreduce_(tensors: Iterable[torch.Tensor], average: bool | None = None,
                       name: str | None = None, op: int | None = None,
                       **kwargs: Any) -> list[torch.Tensor]:
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, **kwargs))


@contextlib.contextmanager
def _submitted_together(pid: int) -> Iterator[None]:
    """The collectives submitted inside go to the engine together, once it ends: one negotiation
    round for the group and one fusion batch for its allreduces, as Horovod's grouped collectives
    (else the engine starts a round at the first, and the rest follow in later ones)."""
    together = _dtrain.SubmittedTogether(pid)
    try:
        yield
    finally:
        together.release()


def _grouped(handles: list[int]) -> int:
    """One handle for several collectives, submitted together so that they share negotiation
    rounds (and fusion buffers, for allreduces); synchronize gives their outputs as a list."""
    return _handle(_AllOf([_handles[h].op for h in handles]),
                   lambda: [_take(h).finish() for h in handles])


class _AllOf:
    """Several collectives waited for as one."""

    def __init__(self, ops: list[_dtrain.CollectiveHandle]) -> None:
        self.ops = ops

    def wait(self) -> None:
        for op in self.ops:
            op.wait()

    @property
    def done(self) -> bool:
        return all(op.done for op in self.ops)


# --- allgather and broadcast --------------------------------------------------------------------

def allgather_async(tensor: torch.Tensor, name: str | None = None,
                    process_set: object = None) -> int:
    """Starts concatenating every rank's `tensor` along the first dimension (which may differ
    between ranks; the others must agree), in rank order."""
    _initialized()
    _check_rows("allgather", tensor)
    pid = _set_id(process_set)
    name = _name("allgather", name, pid)
    work, back = _rows_for_engine(tensor, host_only=pid != 0)
    pending = _dtrain.allgather_async(name, work, pid)
    return _handle(pending, lambda: back(pending.result()), (pid, name))


def _check_rows(kind: str, tensor: torch.Tensor) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError("%s takes a tensor, not %s" % (kind, type(tensor).__name__))
    if tensor.dim() == 0:
        raise InvalidArgument("%s needs a tensor with at least one dimension" % kind)


def _rows_for_engine(tensor: torch.Tensor, host_only: bool) -> tuple[
        torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
    """`tensor` as the engine moves rows of it (entries of the first dimension: a float tensor as
    it is, others as bytes), and the function that turns rows received into a tensor of
    `tensor`'s dtype and device. The engine gives each collective's result memory of its own,
    which the tensor it returns keeps alive: no copy."""
    if tensor.dtype in _FLOATS:
        t = tensor.detach().contiguous()
        return (_on_host(t) if host_only else _for_engine(t),
                lambda rows: rows.to(tensor.device))
    raw, back = _as_rows(tensor)
    return raw, lambda rows: back(rows).to(tensor.device)


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                     process_set: object = None) -> int:
    """Starts copying root's `tensor` into every rank's `tensor`, in place. `root_rank` is a rank
    of the job (a member of `process_set`)."""
    _initialized()
    if not isinstance(tensor, torch.Tensor):
        raise TypeError("broadcast takes a tensor, not %s" % type(tensor).__name__)
    pid = _set_id(process_set)
    root = _root_in_set(pid, root_rank)
    name = _name("broadcast", name, pid)
    back: Callable[[torch.Tensor], torch.Tensor] | None
    if tensor.dtype in _FLOATS and tensor.is_contiguous() and _engine_takes(tensor, pid):
        work, back = tensor.detach(), None
    elif tensor.dtype in _FLOATS:
        work, back = _on_host(tensor.detach().contiguous()), (lambda w: w)
    else:  # its bytes as one row
        work, to_rows = _as_rows(tensor.reshape(1, -1))
        back = lambda w: to_rows(w).reshape(tensor.shape)  # noqa: E731
    pending = _dtrain.broadcast_async(name, work, root, pid)

    def finish() -> torch.Tensor:
        if back is not None:
            with torch.no_grad():
                tensor.copy_(back(work))
        return tensor

    return _handle(pending, finish, (pid, name))


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                    process_set: object = None) -> int:
    """Starts copying root's `tensor` into a new tensor on every rank."""
    return broadcast_async_(tensor.detach().clone(), root_rank, name, process_set)


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
               process_set: object = None) -> torch.Tensor:
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


# --- objects, barrier, join ---------------------------------------------------------------------

def broadcast_object(obj: object, root_rank: int = 0, name: str | None = None,
                     process_set: object = None) -> Any:
    """Root's `obj` (anything pickle can carry) on every rank of `process_set`."""
    name = _name("broadcast_object", name, _set_id(process_set))
    if rank() == root_rank:
        payload = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
        length = torch.tensor([payload.numel()], dtype=torch.int64, device="cpu")
    else:
        length = torch.zeros(1, dtype=torch.int64, device="cpu")
    broadcast_(length, root_rank, name + ".size", process_set)
    if rank() != root_rank:
        payload = torch.empty(int(length[0]), dtype=torch.uint8, device="cpu")
    broadcast_(payload, root_rank, name + ".data", process_set)
    return obj if rank() == root_rank else pickle.loads(payload.numpy().tobytes())


def allgather_object(obj: object, name: str | None = None,
                     process_set: object = None) -> list[Any]:
    """Every rank's `obj` (of `process_set`), in rank order."""
    name = _name("allgather_object", name, _set_id(process_set))
    payload = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
    sizes = synchronize(allgather_async(
        torch.tensor([payload.numel()], dtype=torch.int64, device="cpu"), name + ".sizes",
        process_set))
    data = synchronize(allgather_async(payload, name + ".data", process_set))
    out: list[Any]
    out, at = [], 0
    for n in sizes.tolist():
        out.append(pickle.loads(data[at:at + n].numpy().tobytes()))
        at += n
    return out


def barrier(process_set: object = None) -> None:
    """Blocks until every rank (of `process_set`) has reached the barrier."""
    global _waits
    _initialized()
    _waits += 1
    _dtrain.collectives_barrier(_set_id(process_set))


def join(device: int = -1) -> int:
    """Says this rank has no more data. Until every rank has joined, this rank takes part in the
    other ranks' allreduces with zeros; returns the rank that joined last."""
    _initialized()
    pending = _dtrain.join_async()
    pending.wait()
    return int(pending.result().item())
