"""Errors a user can cause: the CLI prints them as one line and exits with code 2."""


class PearlError(Exception):
    """A user mistake (bad config, bad path, unsupported choice); never a bug in PEARL."""


class ConfigError(PearlError):
    """An experiment, plan or platform file that does not validate; the message names the field."""


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite: the run stops (the CLI prints one line, exit code 1) and
    its last checkpoint, written before the divergence, stays as it was."""
