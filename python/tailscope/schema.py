"""The recording schema, loaded from its single source of truth.

`schema/recording.json` at the repository root defines the on-disk recording: the columns of
the requests table with their types, and the keys meta.json must carry. Nothing here restates
it; this module only finds and parses that file:

1. `$TAILSCOPE_SCHEMA`, if set (tests, unusual layouts);
2. `tailscope/data/recording.json`, the copy setup.py puts into built wheels;
3. `<repo>/schema/recording.json`, for editable installs and checkouts.

python/tests/test_schema.py pins the reader to the repository file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pyarrow as pa

_ARROW_TYPES = {
    "uint64": pa.uint64(),
    "uint32": pa.uint32(),
    "int64": pa.int64(),
    "int32": pa.int32(),
    "string": pa.string(),
    "bool": pa.bool_(),
    "float64": pa.float64(),
}


@dataclass(frozen=True)
class RecordingSchema:
    path: Path
    schema_version: int
    request_columns: dict[str, str]  # name -> type, in file order
    meta_required: tuple[str, ...]
    requests_dir: str
    meta_file: str
    # Every table (requests and the LDB tables): name -> {column: type}.
    tables: dict[str, dict[str, str]] = None  # type: ignore[assignment]
    # Recording versions this reader understands (older ones are readable).
    reads_versions: tuple[int, ...] = ()

    def arrow_type(self, column: str) -> pa.DataType:
        return _ARROW_TYPES[self.request_columns[column]]


def schema_path() -> Path:
    env = os.environ.get("TAILSCOPE_SCHEMA")
    if env:
        return Path(env)
    here = Path(__file__).resolve().parent
    packaged = here / "data" / "recording.json"
    if packaged.exists():
        return packaged
    return here.parent.parent / "schema" / "recording.json"


@lru_cache(maxsize=4)
def _load(path: Path) -> RecordingSchema:
    doc = json.loads(path.read_text())
    cols = {c["name"]: c["type"] for c in doc["tables"]["requests"]}
    unknown = sorted(set(cols.values()) - set(_ARROW_TYPES))
    if unknown:
        raise ValueError(f"{path}: unknown column types {unknown}")
    tables = {name: {c["name"]: c["type"] for c in spec} for name, spec in doc["tables"].items()}
    for name, spec in tables.items():
        bad = sorted(set(spec.values()) - set(_ARROW_TYPES))
        if bad:
            raise ValueError(f"{path}: table {name}: unknown column types {bad}")
    layout = doc.get("layout", {})
    requests_dir = layout.get("requests", "requests/").split("/")[0]
    return RecordingSchema(
        path=path,
        schema_version=int(doc["schema_version"]),
        request_columns=cols,
        meta_required=tuple(doc["meta_required"]),
        requests_dir=requests_dir,
        meta_file=layout.get("meta", "meta.json"),
        tables=tables,
        reads_versions=tuple(int(v) for v in doc.get("reads_versions", [doc["schema_version"]])),
    )


def load_schema() -> RecordingSchema:
    path = schema_path()
    if not path.exists():
        raise FileNotFoundError(f"recording schema not found at {path}; reinstall tailscope or set TAILSCOPE_SCHEMA")
    return _load(path)
