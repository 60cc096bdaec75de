"""The Python reader is pinned to schema/recording.json, the one source of truth."""

import json
from pathlib import Path

import pyarrow.parquet as pq

from tailscope.schema import load_schema, schema_path
from tailscope.synth import write_recording

REPO = Path(__file__).resolve().parents[2]

REPO_SCHEMA = REPO / "schema" / "recording.json"


def test_reader_columns_equal_the_schema_file():
    doc = json.loads(REPO_SCHEMA.read_text())
    s = load_schema()
    assert [(c["name"], c["type"]) for c in doc["tables"]["requests"]] == list(s.request_columns.items())
    assert list(doc["meta_required"]) == list(s.meta_required)
    assert doc["schema_version"] == s.schema_version


def test_reader_uses_the_repo_file_or_an_identical_copy():
    assert schema_path().read_bytes() == REPO_SCHEMA.read_bytes()


def test_analysis_columns_are_in_the_schema():
    from tailscope.analysis.events import ANALYSIS_COLUMNS

    assert set(ANALYSIS_COLUMNS) <= set(load_schema().request_columns)


def test_synthetic_recordings_match_the_schema(tmp_path):
    d = write_recording(tmp_path / "r", 1000, cause=None, parts=1)
    s = load_schema()
    t = pq.read_table(next((d / "requests").glob("*.parquet")))
    assert t.schema.names == list(s.request_columns)
    for name in t.schema.names:
        assert t.schema.field(name).type == s.arrow_type(name)
    meta = json.loads((d / "meta.json").read_text())
    assert set(s.meta_required) <= set(meta)
