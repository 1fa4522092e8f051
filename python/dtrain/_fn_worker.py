"""`@python -m dtrain._fn_worker`: a worker of an elastic job started for a Python function
(dtrain.ray.ElasticRayExecutor.run, dtrain.spark.run_elastic), run on its node by
dtrain._engine_child.ChildRunner. Runs the function pickled at DTRAIN_FN (by the engine's
cloudpickle, which must import here) and writes ``(rank, result)`` to DTRAIN_RESULT, its rank the
one it ended the job with (an elastic job's ranks change as workers come and go)."""

from __future__ import annotations

import os
import pickle
import sys


def main() -> int:
    from dtrain.errors import RemovedFromJob

    with open(os.environ["DTRAIN_FN"], "rb") as f:
        fn, args, kwargs = pickle.load(f)  # cloudpickle's output loads with pickle
    try:
        result = fn(*args, **kwargs)
    except RemovedFromJob as e:  # told to leave before it had a part: no result, no failure
        print(f"dtrain: {e}; exiting", file=sys.stderr, flush=True)
        return 0
    rank = -1
    if "dtrain.torch" in sys.modules:
        import dtrain.torch as hvd

        if hvd.is_initialized():
            rank = hvd.rank()
    with open(os.environ["DTRAIN_RESULT"], "wb") as f:
        pickle.dump((rank, result), f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
