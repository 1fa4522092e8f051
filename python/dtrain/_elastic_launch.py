"""An elastic job of a Python function on an engine's nodes, as dtrain.ray.ElasticRayExecutor and
dtrain.spark.run_elastic start it: `dtrain launch -s 0 --launcher ENGINE --host-discovery-script
...` on this machine (dtrain's elastic driver, src/launcher/watch/elastic_job.h), each worker
`@python -m dtrain._fn_worker` on its node through the engine's proxy (dtrain/_engine_child.py).
The function is pickled to the workers; the results come back from those that ended the job."""

from __future__ import annotations

import collections
import os
import pickle
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any, TextIO


def run_function(dump: Callable[[Any, Any], None], fn: Callable[..., Any],
                 args: tuple[Any, ...], kwargs: dict[str, Any], launch_args: list[str],
                 env: dict[str, str], out: TextIO | None, what: str) -> list[Any]:
    """Runs ``fn(*args, **kwargs)`` as an elastic job (``launch_args``: the launcher's flags,
    ``env``: its variables besides this process's), showing its merged output on ``out`` as it
    comes; the results of the workers that ended it, in their final rank order. Raises, with the
    job's last lines and the launcher's own, when the job fails. ``dump``: the engine's
    cloudpickle.dump."""
    python = sys.executable
    with tempfile.TemporaryDirectory(prefix="dtrain-elastic-") as folder:
        fn_path = os.path.join(folder, "fn.pkl")
        with open(fn_path, "wb") as f:
            dump((fn, tuple(args), dict(kwargs)), f)
        results = os.path.join(folder, "results")
        os.mkdir(results)
        argv = [python, "-m", "dtrain", "launch", "-s", "0", *launch_args, "--",
                "@python", "-m", "dtrain._fn_worker"]
        job_env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "HOROVOD_"))}
        job_env.update(env)
        # The proxies (python3 on PATH) are this Python.
        job_env["PATH"] = os.path.dirname(python) + os.pathsep + job_env.get("PATH", "")
        job_env.update(DTRAIN_FN_FILE=fn_path, DTRAIN_RESULT_DIR=results)
        # The last lines, and the launcher's own apart: a dying engine process can print
        # hundreds of lines (Ray's stack dumps) after the launcher has said why it stopped.
        tail: collections.deque[str] = collections.deque(maxlen=15)
        said: collections.deque[str] = collections.deque(maxlen=15)
        with subprocess.Popen(argv, env=job_env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, errors="replace") as p:
            assert p.stdout is not None
            try:
                for line in p.stdout:
                    (said if line.startswith("dtrain launch:") else tail).append(line)
                    if out is not None:
                        out.write(line)
                        out.flush()
            except BaseException:
                p.terminate()  # Ctrl-C here (or a failing `out`): the launcher stops the job
                raise
        if p.returncode != 0:
            raise RuntimeError(f"the elastic job {what} failed (dtrain launch exited "
                               f"{p.returncode}):\n{''.join(tail)}{''.join(said)}")
        found = []
        for name in sorted(os.listdir(results)):
            with open(os.path.join(results, name), "rb") as f:
                found.append(pickle.load(f))
    return [result for _, result in sorted(found, key=lambda r: r[0])]
