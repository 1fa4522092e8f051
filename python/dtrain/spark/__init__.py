"""dtrain on Spark clusters (``pip install dtrain[spark]``, and a Java runtime):

- ``run``: Horovod's ``horovod.spark.run``, the user's function on one Spark task per rank (a
  barrier stage), results in rank order. Inside it, ``import dtrain.torch as hvd; hvd.init()``
  works as under ``dtrain launch``.
- ``run_elastic``: Horovod's, not supported yet (it says so).
"""

try:
    import pyspark as _pyspark  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("dtrain.spark needs pyspark: pip install 'dtrain[spark]' (and a Java "
                      "runtime, e.g. Debian's openjdk-17-jre-headless)") from e

from .runner import run as run, run_elastic as run_elastic  # noqa: E402
