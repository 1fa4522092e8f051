"""dtrain: distributed data-parallel training for PyTorch users, on dtrain's C++ core.

- ``dtrain.kv``: MXNet's KVStore (``kv = dtrain.kv.create('dist_sync')``) on torch tensors.
- ``dtrain.torch``: Horovod's PyTorch API (``import dtrain.torch as hvd``) and a Gluon-style
  ``Trainer``.
- ``dtrain.optimizer``, ``dtrain.lr_scheduler``: MXNet's optimizers by name, run by the core.
- ``dtrain.data``: ``SplitSampler`` (the data set split over workers) and ``split_and_load``.

Roles on import, as ``import mxnet`` does: a process started with ``DMLC_ROLE=server`` or
``DMLC_ROLE=scheduler`` runs that role when it imports dtrain and exits when the job ends, so one
script serves every role of a job started by ``dtrain launch``, MXNet's ``tools/launch.py`` or by
hand.
"""

import atexit as _atexit
import sys as _sys
from importlib import metadata as _metadata

import torch as _torch  # loads LibTorch before the extension that links it

from . import _build_info


def _check_torch() -> None:
    # The extension uses torch's C++ API, which changes between releases: another torch than the
    # one it was compiled against fails with undefined symbols, or worse, later.
    if _torch.__version__ != _build_info.TORCH_VERSION:
        raise ImportError(
            f"dtrain was built against torch {_build_info.TORCH_VERSION}, and this Python has "
            f"torch {_torch.__version__}: rebuild it here with "
            f"`pip install --no-build-isolation --force-reinstall <dtrain checkout>`")


_check_torch()

from . import _dtrain, _lifetime, _threads  # noqa: E402
from .errors import (  # noqa: E402,F401  (`X as X`: a re-export, for type checkers)
    ConfigError as ConfigError, Error as Error, InvalidArgument as InvalidArgument,
    PeerError as PeerError, TimeoutError as TimeoutError)

try:
    __version__ = _metadata.version("dtrain")  # one place: project() in CMakeLists.txt
except _metadata.PackageNotFoundError:  # a copied package without its dist-info
    __version__ = "0+unknown"


def _run_role_if_service() -> None:
    code = _dtrain.run_role_if_service()
    if code is not None:
        _sys.stdout.flush()
        _sys.stderr.flush()
        _sys.exit(code)


_run_role_if_service()


_threads.fit(_dtrain.usable_cores())  # torch's and OpenBLAS's threads: _threads.py says why

from . import data, kv, lr_scheduler, optimizer  # noqa: E402

kvstore = kv  # MXNet spells it both ways: mx.kv and mx.kvstore


def _close_everything() -> None:
    _lifetime.close_all()
    if _dtrain.collectives_is_initialized():
        _dtrain.collectives_shutdown()


_atexit.register(_close_everything)
