"""Horovod's module path ``horovod.torch.mpi_ops``, for scripts that import from it (``from
horovod.torch.mpi_ops import allreduce_async_`` becomes ``from dtrain.torch.mpi_ops import
allreduce_async_``): the collectives, the process sets, the ops and the queries, as Horovod's
mpi_ops holds them. They live in ops.py, autograd.py, scatter_ops.py and process_sets.py."""

from .autograd import *  # noqa: F401,F403
from .autograd import __all__ as _autograd_all
from .ops import *  # noqa: F401,F403
from .ops import __all__ as _ops_all
from .optimizer import sparse_allreduce_async as sparse_allreduce_async  # noqa: F401
from .process_sets import *  # noqa: F401,F403
from .process_sets import __all__ as _process_sets_all
from .scatter_ops import *  # noqa: F401,F403
from .scatter_ops import __all__ as _scatter_all

__all__ = list(_ops_all) + list(_autograd_all) + list(_scatter_all) + list(_process_sets_all) + [
    "sparse_allreduce_async",
]
