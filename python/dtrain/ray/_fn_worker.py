"""`@python -m dtrain.ray._fn_worker`: a worker of ElasticRayExecutor.run (dtrain/ray/elastic.py),
started on a Ray node by `dtrain launch --launcher ray` (dtrain/ray/_node_exec.py). Runs the
function pickled at DTRAIN_RAY_FN and writes ``(rank, result)`` to DTRAIN_RAY_RESULT, its rank the
one it ended the job with (an elastic job's ranks change as workers come and go)."""

from __future__ import annotations

import os
import pickle
import sys

from ray import cloudpickle  # Ray vendors it


def main() -> int:
    from dtrain.errors import RemovedFromJob

    with open(os.environ["DTRAIN_RAY_FN"], "rb") as f:
        fn, args, kwargs = cloudpickle.load(f)
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
    with open(os.environ["DTRAIN_RAY_RESULT"], "wb") as f:
        pickle.dump((rank, result), f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
