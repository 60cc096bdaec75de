"""The one exception type of the clone pipeline: its message is printed as one line."""


class CloneError(Exception):
    """An error for the user (bad target, missing tool, corrupt profile...)."""
