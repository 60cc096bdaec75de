"""The one exception type of the clone pipeline: its message is printed as one line."""

from __future__ import annotations

import json
from pathlib import Path


class CloneError(Exception):
    """An error for the user (bad target, missing tool, corrupt profile...)."""


def read_json(path: Path | str) -> object:
    """A JSON file's content. A file that cannot be read raises OSError, for the caller to say
    what a missing one means (fall back, or name the step that writes it); one that is not JSON,
    or not text at all, is a one-line CloneError naming it."""
    try:
        return json.loads(Path(path).read_bytes())
    except json.JSONDecodeError as exc:
        raise CloneError(f"{path} is corrupt: not JSON ({exc.msg} at line {exc.lineno})") from None
    except UnicodeDecodeError:
        raise CloneError(f"{path} is corrupt: not JSON (not UTF-8 text)") from None
