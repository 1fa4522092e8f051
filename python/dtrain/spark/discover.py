"""`python3 -m dtrain.spark.discover`: the host discovery script of the elastic jobs that
dtrain.spark.run_elastic starts (`dtrain launch --launcher spark`): one line `ADDRESS:SLOTS` for
each address where the job's Spark tasks run, its slots as many as the live tasks there. A task
that dies drops out, one that Spark starts again comes in: the elastic job follows the tasks.
DTRAIN_SPARK_REGISTRY and DTRAIN_SPARK_TOKEN (run_elastic sets them): the driver's registry."""

from __future__ import annotations

import collections
import sys

from . import _agents


def main() -> int:
    registry, token = _agents.registry_from_env()
    counts = collections.Counter(a["address"] for a in _agents.list_agents(registry, token))
    for address, n in sorted(counts.items()):
        print(f"{address}:{n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
