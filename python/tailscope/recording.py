"""Load a recording directory into numpy arrays (the I/O edge of the analysis).

A recording is `meta.json` plus `requests/*.parquet` (rotated parts read as one table), as
defined by schema/recording.json. `load_recording` validates what it reads and raises
`RecordingError` with one line that names the file at fault; the analysis never sees
pyarrow or JSON.

Nulls: a null in a counter column means the event was not recorded for that request. Each
column comes back with nulls filled by 0, and `Recording.nulls[col]` is a bool mask of the
null rows (only for columns that have any). Rows with a null latency or start are dropped: a
request without a latency cannot be analysed. A null `counters_valid` reads as false.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tailscope.schema import RecordingSchema, load_schema


class RecordingError(Exception):
    """A recording cannot be read. The message is one line, fit for the user."""


@dataclass
class Recording:
    path: Path
    meta: dict
    columns: dict[str, np.ndarray]
    nulls: dict[str, np.ndarray] = field(default_factory=dict)
    kind_names: list[str] = field(default_factory=list)  # codes in columns["kind"] index this
    files: list[Path] = field(default_factory=list)
    note: str = ""  # why the recording is empty, when it is

    @property
    def n_rows(self) -> int:
        lat = self.columns.get("latency_ns")
        return 0 if lat is None else int(lat.size)


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:200]


def read_meta(path: Path, schema: RecordingSchema) -> dict:
    """Parse and validate meta.json: JSON object, supported schema_version, required keys."""
    meta_path = path / schema.meta_file
    if not path.exists():
        raise RecordingError(f"{path}: no such directory")
    if not path.is_dir():
        raise RecordingError(f"{path}: not a directory (expected a recording directory)")
    if not meta_path.exists():
        raise RecordingError(f"{path}: no {schema.meta_file}; not a tailscope recording (or still being written)")
    try:
        meta = json.loads(meta_path.read_text())
    except UnicodeDecodeError as exc:
        raise RecordingError(f"{meta_path}: not UTF-8 text ({_short(exc)})") from exc
    except json.JSONDecodeError as exc:
        raise RecordingError(
            f"{meta_path}: corrupt or truncated JSON (line {exc.lineno} column {exc.colno}: {exc.msg})"
        ) from exc
    if not isinstance(meta, dict):
        raise RecordingError(f"{meta_path}: expected a JSON object, found {type(meta).__name__}")
    version = meta.get("schema_version")
    if version is None:
        raise RecordingError(f"{meta_path}: missing required key 'schema_version'")
    readable = schema.reads_versions or (schema.schema_version,)
    if not isinstance(version, int) or isinstance(version, bool) or version not in readable:
        raise RecordingError(
            f"recording schema version {version} is not supported by this tailscope "
            f"(supports {', '.join(map(str, readable))}); upgrade tailscope"
        )
    missing = [k for k in schema.meta_required if k not in meta]
    if missing:
        raise RecordingError(f"{meta_path}: missing required keys: {', '.join(missing)}")
    return meta


def load_recording(path: str | Path, columns: list[str] | None = None) -> Recording:
    """Read meta.json and the requests table. `columns` limits what is loaded (speed);
    every schema column must still be present in every part."""
    schema = load_schema()
    path = Path(path)
    meta = read_meta(path, schema)
    wanted = list(schema.request_columns) if columns is None else list(columns)
    unknown = [c for c in wanted if c not in schema.request_columns]
    if unknown:
        raise ValueError(f"not in the recording schema: {unknown}")
    req_dir = path / schema.requests_dir
    files = sorted(req_dir.glob("*.parquet")) if req_dir.is_dir() else []
    rec = Recording(path=path, meta=meta, columns={}, files=files)
    if not req_dir.is_dir():
        rec.note = f"no {schema.requests_dir}/ directory in the recording"
    elif not files:
        rec.note = f"no Parquet parts in {schema.requests_dir}/"

    # Pass 1: open every part, check its columns, count rows (footer only).
    opened = []
    for f in files:
        rel = f.relative_to(path)
        try:
            pf = pq.ParquetFile(f, read_dictionary=["kind"] if "kind" in wanted else None)
            names = set(pf.schema_arrow.names)
            rows = pf.metadata.num_rows
        except Exception as exc:  # pyarrow raises several types for corrupt files
            raise RecordingError(f"{rel}: truncated or corrupt Parquet file ({_short(exc)})") from exc
        missing = [c for c in schema.request_columns if c not in names]
        if missing:
            raise RecordingError(
                f"{rel}: missing columns {', '.join(missing)} required by recording schema {schema.schema_version}"
            )
        opened.append((rel, pf, rows))

    # Pass 2: read each part and copy it into preallocated arrays (numpy allocations use
    # transparent huge pages; one copy, no concatenation; peak memory ≈ result + one part).
    total = sum(r for _, _, r in opened)
    numeric = [c for c in wanted if c != "kind"]
    target = pa.schema([(c, schema.arrow_type(c)) for c in wanted])
    out = {c: np.empty(total, dtype=_numpy_dtype(schema.request_columns[c])) for c in numeric}
    null_masks: dict[str, np.ndarray] = {}
    kind_parts = []
    pos = 0
    for rel, pf, rows in opened:
        try:
            t = pf.read(columns=wanted, use_threads=False)
        except Exception as exc:
            raise RecordingError(f"{rel}: truncated or corrupt Parquet file ({_short(exc)})") from exc
        if t.num_rows != rows:
            raise RecordingError(f"{rel}: footer says {rows} rows, read {t.num_rows}; corrupt Parquet file")
        try:
            cast_to = pa.schema([(f.name, t.schema.field(f.name).type if f.name == "kind" else f.type) for f in target])
            if t.schema != cast_to:
                t = t.cast(cast_to)
        except Exception as exc:
            raise RecordingError(f"{rel}: column types do not match the recording schema ({_short(exc)})") from exc
        for name in numeric:
            col = t.column(name)
            dest = out[name][pos : pos + rows]
            off = 0
            for chunk in col.chunks:
                k = len(chunk)
                if chunk.null_count:
                    mask = null_masks.setdefault(name, np.zeros(total, dtype=bool))
                    mask[pos + off : pos + off + k] = chunk.is_null().to_numpy(zero_copy_only=False)
                    chunk = chunk.fill_null(False if pa.types.is_boolean(chunk.type) else 0)
                dest[off : off + k] = chunk.to_numpy(zero_copy_only=False)
                off += k
        if "kind" in wanted:
            kind_parts.append(t.column("kind"))
        pos += rows
        del t
    rec.columns.update(out)
    rec.nulls.update(null_masks)
    if "kind" in wanted:
        chunks = [c for part in kind_parts for c in part.chunks]
        rec.columns["kind"], rec.kind_names = _encode_kind(
            pa.chunked_array(chunks, type=pa.string()) if not chunks else _as_chunked(chunks)
        )
    _drop_rows_without_latency(rec)
    if rec.n_rows == 0 and not rec.note:
        rec.note = "the Parquet parts hold no rows"
    return rec


def _numpy_dtype(type_name: str) -> np.dtype:
    return {
        "uint64": np.uint64,
        "uint32": np.uint32,
        "int64": np.int64,
        "int32": np.int32,
        "bool": np.bool_,
        "float64": np.float64,
    }[type_name]


def _as_chunked(chunks: list) -> pa.ChunkedArray:
    """Chunks of string or dictionary<string> arrays (parts may differ) as one ChunkedArray."""
    return pa.chunked_array(
        [c if pa.types.is_dictionary(c.type) else c.dictionary_encode() for c in chunks]
        if any(pa.types.is_dictionary(c.type) for c in chunks)
        else chunks
    )


def _encode_kind(col: pa.ChunkedArray) -> tuple[np.ndarray, list[str]]:
    """Kinds as int32 codes into a list of names (a dictionary encoding across all parts)."""
    names: dict[str, int] = {}
    parts = []
    for chunk in col.chunks:
        d = chunk.dictionary_encode() if not pa.types.is_dictionary(chunk.type) else chunk
        labels = ["" if s is None else s for s in d.dictionary.to_pylist()]
        mapping = np.array([names.setdefault(s, len(names)) for s in labels] or [0], dtype=np.int32)
        idx = d.indices.fill_null(0).to_numpy(zero_copy_only=False) if len(d) else np.zeros(0, np.int32)
        codes = mapping[idx] if labels else np.zeros(len(d), np.int32)
        if d.indices.null_count:
            codes = codes.copy()
            codes[d.indices.is_null().to_numpy(zero_copy_only=False)] = names.setdefault("", len(names))
        parts.append(codes.astype(np.int32, copy=False))
    codes = np.concatenate(parts) if parts else np.zeros(0, np.int32)
    return codes, list(names)


def _drop_rows_without_latency(rec: Recording) -> None:
    bad = None
    for key in ("latency_ns", "start_ns"):
        if key in rec.nulls:
            bad = rec.nulls[key] if bad is None else bad | rec.nulls[key]
    if bad is None or not bad.any():
        return
    keep = ~bad
    rec.columns = {k: v[keep] for k, v in rec.columns.items()}
    rec.nulls = {k: v[keep] for k, v in rec.nulls.items() if k not in ("latency_ns", "start_ns")}
