"""The CLI: bad input gives one clear line on stderr and a non-zero exit; never a traceback."""

import json
import os

import pytest

from tailscope.synth import write_recording


def _one_line_error(p, *needles):
    assert p.returncode != 0
    assert "Traceback" not in p.stderr and "Traceback" not in p.stdout
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, p.stderr
    for n in needles:
        assert n in lines[0], lines[0]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return write_recording(tmp_path_factory.mktemp("small") / "rec", 5_000, cause="runnable", parts=2)


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    (dst / "report.html").unlink(missing_ok=True)
    return dst


def test_missing_dir(cli, tmp_path):
    _one_line_error(cli("report", tmp_path / "nope"), "no such directory")


def test_not_a_recording(cli, tmp_path):
    _one_line_error(cli("report", tmp_path), "no meta.json")


def test_not_a_directory(cli, tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    _one_line_error(cli("report", f), "not a directory")


def test_corrupt_meta(cli, small, tmp_path):
    d = _copy(small, tmp_path / "r")
    (d / "meta.json").write_text("{not json")
    _one_line_error(cli("report", d), "meta.json", "corrupt or truncated")


def test_truncated_meta(cli, small, tmp_path):
    d = _copy(small, tmp_path / "r")
    text = (d / "meta.json").read_text()
    (d / "meta.json").write_text(text[: len(text) // 2])
    _one_line_error(cli("report", d), "corrupt or truncated")


def test_meta_missing_keys(cli, small, tmp_path):
    d = _copy(small, tmp_path / "r")
    meta = json.loads((d / "meta.json").read_text())
    del meta["drops"], meta["clock"]
    (d / "meta.json").write_text(json.dumps(meta))
    _one_line_error(cli("report", d), "missing required keys", "drops", "clock")


def test_unknown_schema_version(cli, small, tmp_path):
    d = _copy(small, tmp_path / "r")
    meta = json.loads((d / "meta.json").read_text())
    meta["schema_version"] = 7
    (d / "meta.json").write_text(json.dumps(meta))
    _one_line_error(
        cli("report", d),
        "recording schema version 7 is not supported by this tailscope (supports 1, 2); upgrade tailscope",
    )


def test_truncated_parquet(cli, small, tmp_path):
    d = _copy(small, tmp_path / "r")
    part = sorted((d / "requests").glob("*.parquet"))[1]
    data = part.read_bytes()
    part.write_bytes(data[: len(data) // 2])
    _one_line_error(cli("report", d), part.name, "truncated or corrupt")


def test_garbage_parquet(cli, small, tmp_path):
    d = _copy(small, tmp_path / "r")
    part = sorted((d / "requests").glob("*.parquet"))[0]
    part.write_bytes(b"PAR1" + os.urandom(4000) + b"PAR1")
    _one_line_error(cli("report", d), part.name)


def test_empty_recording_is_not_an_error(cli, tmp_path):
    d = write_recording(tmp_path / "empty", 0, cause=None, meta={"drops": {"ring_full": 12}})
    p = cli("report", d)
    assert p.returncode == 0, p.stderr
    assert "no requests recorded" in p.stdout.lower() and "12" in p.stdout
    assert "no requests recorded" in (d / "report.html").read_text().lower()
    j = cli("report", d, "--json")
    assert j.returncode == 0
    doc = json.loads(j.stdout)
    assert doc["empty"] is True and doc["message"] == "no requests recorded" and doc["causes"] == []


def test_empty_requests_dir_missing(cli, small, tmp_path):
    d = tmp_path / "r"
    d.mkdir()
    (d / "meta.json").write_text((small / "meta.json").read_text())
    p = cli("report", d, "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["empty"] is True


def test_bad_options(cli, small):
    _one_line_error(cli("report", small, "--target", "p100"), "--target")
    _one_line_error(cli("report", small, "--kind", "DEL"), "kinds present")
    _one_line_error(cli("report", small, "--segment", "0"), "--segment")


def test_report_and_json(cli, small, tmp_path):
    out = tmp_path / "x.html"
    p = cli("report", small, "--out", out)
    assert p.returncode == 0, p.stderr
    assert "p99 is" in p.stdout and "runnable wait" in p.stdout and str(out) in p.stdout
    html = out.read_text()
    assert "<script src=" not in html and "<link " not in html  # self-contained: plotly.js inline
    j = cli("report", small, "--json", "--target", "99.9", "--top", "3")
    doc = json.loads(j.stdout)
    assert doc["p_target"] == pytest.approx(0.999) and doc["target_label"] == "p99.9"
    c = doc["causes"][0]
    for key in (
        "event",
        "impact_ns",
        "impact_pct_of_target",
        "threshold_value",
        "threshold_percentile",
        "high_count",
        "caused_by",
        "explained_by",
        "adjusted_impact_ns",
    ):
        assert key in c
    assert {"p50_ns", "p_target_ns", "segments", "health", "headline"} <= set(doc)


def test_record_without_agent(cli, tmp_path):
    env_bad = tmp_path / "missing-agent"
    import subprocess
    import sys

    p = subprocess.run(
        [sys.executable, "-m", "tailscope", "record", "-o", str(tmp_path / "r")],
        capture_output=True,
        text=True,
        env={**os.environ, "TAILSCOPE_AGENT": str(env_bad)},
    )
    _one_line_error(p, "TAILSCOPE_AGENT")


def test_record_execs_agent(tmp_path):
    import subprocess
    import sys

    fake = tmp_path / "agent"
    fake.write_text('#!/bin/sh\necho agent-args: "$@"\n')
    fake.chmod(0o755)
    p = subprocess.run(
        [sys.executable, "-m", "tailscope", "record", "-o", "out", "--", "sleep", "1"],
        capture_output=True,
        text=True,
        env={**os.environ, "TAILSCOPE_AGENT": str(fake)},
    )
    assert p.returncode == 0 and p.stdout.strip() == "agent-args: record -o out -- sleep 1"
