"""The errors that mean "bad input" (printed as one line by the CLI, never as a traceback)."""

from eagle_eval.capture import AuxLayerError
from eagle_eval.config import ConfigError
from eagle_eval.data import DataError
from eagle_eval.dumps import DumpError
from eagle_eval.head_io import CheckpointError
from eagle_eval.server import ServerError
from eagle_eval.target import TargetError

USER_ERRORS = (AuxLayerError, ConfigError, DataError, CheckpointError, TargetError, FileNotFoundError,
               ServerError, DumpError)
