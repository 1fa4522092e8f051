"""dtrain on Spark clusters (``pip install dtrain[spark]``, and a Java runtime):

- ``run``: Horovod's ``horovod.spark.run``, the user's function on one Spark task per rank (a
  barrier stage), results in rank order. Inside it, ``import dtrain.torch as hvd; hvd.init()``
  works as under ``dtrain launch``.
- ``run_elastic``: Horovod's elastic run, on as many tasks as Spark runs between a minimum and a
  maximum, going on when a task is lost.
"""

try:
    import pyspark as _pyspark  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("dtrain.spark needs pyspark: pip install 'dtrain[spark]' (and a Java "
                      "runtime, e.g. Debian's openjdk-17-jre-headless)") from e

from .elastic import run_elastic as run_elastic  # noqa: E402
from .runner import run as run  # noqa: E402
