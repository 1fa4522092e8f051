"""Horovod's PyTorch MNIST example (horovod_mnist.py, unchanged) on Spark, started by
dtrain.spark.run, Horovod's `horovod.spark.run` API: one Spark task per rank (a barrier stage),
no hostfile, no ssh.

    pip install 'dtrain[spark]'    # and a Java runtime (Debian: openjdk-17-jre-headless)
    python3 examples/python/spark_fashion_mnist.py --num-proc 2              # Spark on this machine
    spark-submit examples/python/spark_fashion_mnist.py --num-proc 8 -- --epochs 3   # a cluster

Arguments after `--` go to horovod_mnist.py. The ranks' output comes back when they end, each line
prefixed with its rank ("[0]<stdout>:Epoch N: Test_acc X"). Spark ships this folder's two modules
to the executors (addPyFile); the data is read from each host's Debian dataset-fashion-mnist
(--data-dir to change it).
"""

import argparse
import os
import sys

from pyspark.sql import SparkSession

import dtrain.spark

HERE = os.path.dirname(os.path.abspath(__file__))


def train(argv):
    import horovod_mnist  # shipped by addPyFile

    sys.argv = ["horovod_mnist.py", *argv]
    horovod_mnist.main()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--num-proc", type=int, default=2)
    ap.add_argument("--master", default=None,
                    help="Spark's master URL (default: spark-submit's, or local[*])")
    ap.add_argument("train_args", nargs="*", help="horovod_mnist.py's, after --")
    args = ap.parse_args()

    builder = SparkSession.builder.appName("dtrain-fashion-mnist")
    if args.master:
        builder = builder.master(args.master)
    # The executors' Python is this one (a venv's, with torch and dtrain), as Horovod's docs ask.
    spark = builder.config("spark.pyspark.python", sys.executable).getOrCreate()
    try:
        for module in ("horovod_mnist.py", "fashion_mnist.py"):
            spark.sparkContext.addPyFile(os.path.join(HERE, module))
        dtrain.spark.run(train, args=(args.train_args,), num_proc=args.num_proc,
                         stdout=sys.stdout, stderr=sys.stderr)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
