"""The exceptions dtrain raises.

Every error names what went wrong and, where there is one, the key or the node involved
(role, rank, host:port), e.g. ``worker 1 (127.0.0.1:41234) was lost: its connection closed``.
"""

import builtins


class Error(RuntimeError):
    """Base class of dtrain's errors."""


class InvalidArgument(Error, ValueError):
    """Misuse: an unknown key, a wrong shape or dtype, a key initialised twice, a bad option."""


class ConfigError(Error, ValueError):
    """A DMLC_*, PS_*, MXNET_* or DTRAIN_* environment variable is missing or malformed."""


class HorovodInternalError(RuntimeError):
    """Horovod's name for a collective that failed because the job broke under it (a rank left,
    stopped answering, or the collectives were shut down): what Horovod scripts and its elastic
    mode catch. dtrain's PeerError and TimeoutError are both kinds of it."""


class RemovedFromJob(Error):
    """An elastic job's launcher no longer has a place for this worker (its host left the
    discovery script's output): dtrain.torch.elastic.run ends the process with exit code 0."""


class PeerError(Error, HorovodInternalError):
    """Another node of the job died, was cut off, or sent something it must not."""


class TimeoutError(Error, builtins.TimeoutError, HorovodInternalError):  # noqa: A001 (Horovod and MXNet users catch it by this name)
    """A blocking wait ran past its deadline; the message says what it waited for."""
