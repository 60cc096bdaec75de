"""bench/varmri.py's --setups merge: rows it cannot keep are said, not dropped silently."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _varmri():
    spec = importlib.util.spec_from_file_location("bench_varmri", ROOT / "bench" / "varmri.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_merge_keeps_rows_of_other_baselines_and_names_the_ones_it_drops(tmp_path, capsys):
    v = _varmri()
    v.RESULTS = tmp_path
    run = [{"max_rps": 100.0, "round": 0}]
    old = {"runs": {"none": run, "bpftrace": run, "perf": run}, "rate80": {"none": 80.0}, "command": "old"}
    (tmp_path / "varmri.json").write_text(json.dumps({"raw": {"redis": old}}))
    # `--setups tailscope-infer-1%` measures its baseline `none` again: bpftrace and perf were paired
    # by round with the old `none` runs, so they cannot be kept with the new ones
    new = {"runs": {"none": run, "tailscope-infer-1%": run}, "rate80": {"none": 90.0}, "attach": {}, "command": "new"}
    got = v.merge_earlier("redis", new)
    assert set(got["runs"]) == {"none", "tailscope-infer-1%"}
    err = capsys.readouterr().err
    assert "earlier rows not kept" in err and "bpftrace, perf" in err, err
    # a row whose baseline was not measured now is kept, with that baseline's runs and rate
    # (none-plain's own baseline is none, measured now, but it comes back as the marker row's)
    old2 = {"runs": {"none-plain": run, "tailscope-marker-1%": run, "none": run}, "rate80": {"none-plain": 70.0}}
    (tmp_path / "varmri.json").write_text(json.dumps({"raw": {"memcached": old2}}))
    new2 = {"runs": {"none": run}, "rate80": {"none": 90.0}, "attach": {}, "command": "new"}
    got2 = v.merge_earlier("memcached", new2)
    assert {"none-plain", "tailscope-marker-1%"} <= set(got2["runs"]) and got2["rate80"]["none-plain"] == 70.0
    assert "not kept" not in capsys.readouterr().err
