"""What dtrain closes when the interpreter exits, in order: trainers before the stores they use,
stores (a dist store tells the scheduler that this worker is done) before the collectives."""

import weakref

TRAINER, STORE = 0, 1
_live = {TRAINER: weakref.WeakSet(), STORE: weakref.WeakSet()}


def register(obj, kind):
    """`obj` has a close() that must run before exit, unless it ran already."""
    _live[kind].add(obj)


def close_all():
    for kind in (TRAINER, STORE):
        for obj in list(_live[kind]):
            obj.close()
