"""The exceptions hetero_nn raises, each carrying the facts a user needs to act.

Every error derives from :class:`HeteroNNError`, so ``except hn.HeteroNNError``
catches everything the library raises on purpose.
"""


class HeteroNNError(Exception):
    """Base class of every error hetero_nn raises on purpose."""


class ShapeError(HeteroNNError, ValueError):
    """A layer got an input of the wrong shape (raised when the network is built)."""


class DatasetFormatError(HeteroNNError, ValueError):
    """A dataset file is not what its format promises (magic, size, labels)."""


class DeviceError(HeteroNNError, RuntimeError):
    """A device was asked for that does not exist here (no GPU, no CuPy, bad spec)."""


class PolicyError(HeteroNNError, ValueError):
    """An unknown scheduling policy name."""


class SubmitError(HeteroNNError, ValueError):
    """A task was submitted wrongly: operand count, foreign handle, bad mode."""


class TaskError(HeteroNNError, RuntimeError):
    """A codelet raised while running; ``codelet`` and ``task_id`` say which.

    The original exception is chained as ``__cause__``.
    """

    def __init__(self, message, *, codelet=None, task_id=None):
        super().__init__(message)
        self.codelet = codelet
        self.task_id = task_id

    def __reduce__(self):  # keep codelet and task id across processes (distributed)
        return (_task_error, (self.args[0], self.codelet, self.task_id))


def _task_error(message, codelet, task_id):
    return TaskError(message, codelet=codelet, task_id=task_id)


class ArenaError(HeteroNNError, MemoryError):
    """An arena could not serve an allocation (it says what it holds)."""


class ConfigError(HeteroNNError, ValueError):
    """An invalid option (CLI or API); the message names the option."""


class CheckpointError(HeteroNNError, ValueError):
    """A checkpoint file is missing, corrupt, or does not fit the model."""


class TrainingDiverged(HeteroNNError, FloatingPointError):
    """The loss became NaN or infinite; the last good checkpoint is kept."""


class DeviceMemoryError(HeteroNNError, MemoryError):
    """A device memory node cannot hold what a task needs, even after evicting
    every replica that is valid elsewhere (it says how many bytes, and where)."""


class ClusterError(HeteroNNError, RuntimeError):
    """A Dask cluster lost the work of a step (no worker left, scheduler gone)."""


class ConversionError(HeteroNNError, ValueError):
    """A model does not convert between PyTorch and hetero_nn (``from_torch``, ``to_torch``);
    the message names the node, its target and the source line at fault."""
