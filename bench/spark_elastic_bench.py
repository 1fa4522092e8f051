"""dtrain.spark.run_elastic losing a task and growing back, timed: on a `local-cluster[2,1,1024]`
Spark (a master and two executor JVMs here), TRIALS runs of tests/python/test_spark.py's
`lose_a_task_then_grow_back` (rank 1 kills its task's Python worker at step 8; Spark retries the
task; the job goes on alone, then grows back to 2 workers). Prints, per trial, the launcher's
memberships with their times since `dtrain launch` started, and the wall time of run_elastic.

    build/venv/torch2/bin/python bench/spark_elastic_bench.py [--trials 4]
"""

import argparse
import io
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(HERE, "..", "tests", "python")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--trials", type=int, default=4)
    args = ap.parse_args()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    sys.path.insert(0, TESTS)
    from pyspark.sql import SparkSession

    import dtrain.spark
    import test_spark  # its functions, shipped to the executors by reference

    work = tempfile.mkdtemp(prefix="dtrain-spark-bench-")
    session = (SparkSession.builder.master("local-cluster[2,1,1024]")
               .config("spark.ui.enabled", "false")
               .config("spark.pyspark.python", sys.executable)
               .config("spark.executorEnv.PYTHONPATH", os.pathsep.join([TESTS] + sys.path))
               .config("spark.local.dir", work).config("spark.worker.dir", work).getOrCreate())
    try:
        dtrain.spark.run(test_spark.ranks_and_sum, num_proc=2)  # the executors are up
        for trial in range(args.trials):
            out = io.StringIO()
            start = time.monotonic()
            results = dtrain.spark.run_elastic(test_spark.lose_a_task_then_grow_back,
                                               args=(os.path.join(work, f"died-{trial}"),),
                                               num_proc=2, min_np=1, stdout=out, verbose=0)
            wall = time.monotonic() - start
            lines = [line.split("elastic at ", 1)[1] for line in out.getvalue().splitlines()
                     if "elastic at " in line]
            print(f"trial {trial}: results {results}, {wall:.1f} s; " + "; ".join(lines))
    finally:
        session.stop()


if __name__ == "__main__":
    main()
