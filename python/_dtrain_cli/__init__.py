"""The `dtrain` and `dtrain-train` commands of a `pip install`ed dtrain.

They are C++ programs in dtrain/_bin; these entry points only find them and exec them. This module
is outside the dtrain package on purpose: importing dtrain loads torch (seconds) and, under
DMLC_ROLE, runs that role, neither of which a command line tool should do.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys


def _program(name: str) -> str:
    """The program's path: dtrain/_bin/ of a pip install, else the build tree that the package was
    staged in (<build>/python/dtrain), else PATH (a `cmake --install`)."""
    spec = importlib.util.find_spec("dtrain")  # finds the package without importing it
    candidates = []
    if spec is not None and spec.submodule_search_locations:
        package = list(spec.submodule_search_locations)[0]
        build = os.path.dirname(os.path.dirname(package))
        candidates += [os.path.join(package, "_bin", name),
                       os.path.join(build, "src", "tools" if name == "dtrain" else "train", name)]
    on_path = shutil.which(name)
    if on_path and os.path.realpath(on_path) != os.path.realpath(sys.argv[0]):
        candidates.append(on_path)
    for path in candidates:
        if os.access(path, os.X_OK) and not os.path.isdir(path):
            return path
    sys.exit(f"{name}: dtrain's programs are not installed beside the dtrain package of "
             f"{sys.executable}: reinstall it (pip install --no-build-isolation <checkout>)")


def run(name: str, args: list[str]) -> None:
    """Replaces this process with the program `name` (dtrain or dtrain-train)."""
    path = _program(name)
    # `dtrain plot` and the Python that jobs' `python3 -m dtrain ...` would use: this environment's.
    os.environ.setdefault("DTRAIN_PYTHON", sys.executable)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(path, [name, *args])


def dtrain() -> None:
    run("dtrain", sys.argv[1:])


def dtrain_train() -> None:
    run("dtrain-train", sys.argv[1:])
