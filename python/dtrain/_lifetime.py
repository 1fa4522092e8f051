"""What dtrain closes when the interpreter exits, in order: trainers before the stores they use,
stores (a dist store tells the scheduler that this worker is done) before the collectives."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing import Protocol

    class _Closable(Protocol):
        def close(self) -> None: ...

TRAINER, STORE = 0, 1
# Trainers and KVStores, as Any: dtrain.kv.waitall calls the stores' _waitall too.
_live: dict[int, weakref.WeakSet[Any]] = {TRAINER: weakref.WeakSet(), STORE: weakref.WeakSet()}


def register(obj: _Closable, kind: int) -> None:
    """`obj` has a close() that must run before exit, unless it ran already."""
    _live[kind].add(obj)


def close_all() -> None:
    for kind in (TRAINER, STORE):
        for obj in list(_live[kind]):
            obj.close()
