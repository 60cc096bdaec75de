#!/usr/bin/env python3
"""Developer tool: a clone's simulated miss curve against its original's, without re-profiling.

Regenerates the clone of a finished `tailscope clone` directory (its private/profile.json and
private/skeleton.json) with the knobs given, builds it, and runs callgrind windows at the named
configurations: `A`, `B` (the held-out one: evaluation only) or a sweep size in bytes (I1 = D1 =
that size, 8/16-way, as the profile's sweep). Prints per request: instructions, data refs, and
I1 / D1 / LL misses of the original and the clone.

    .venv/bin/python bench/ditto/curve.py bench/work/ditto/memcached --configs A,8192,65536 \
        [--knobs tuned|default|'{"code_scale": 0.3}'] [--out /tmp/curve]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))

from tailscope.clone import generate as gen  # noqa: E402
from tailscope.clone import tune  # noqa: E402
from tailscope.clone import valgrind as vg  # noqa: E402
from tailscope.clone.workingset import cache_arg  # noqa: E402


def original_at(prof: dict, size: int) -> dict | None:
    """The original's I1 / D1 misses per request at a swept size (from the profile's sweep)."""
    req = max(1, prof["valgrind"].get("requests") or 1)
    out = {"I1": 0.0, "D1": 0.0, "Ir": 0.0, "Dref": 0.0}
    found = False
    for b in prof["body"].values():
        if not b.get("ws_sizes") or size not in b["ws_sizes"]:
            continue
        i = b["ws_sizes"].index(size)
        ev = b.get("events", req) / req
        out["I1"] += (b["I_accesses"] - b["I_hits"][i]) * ev
        out["D1"] += (b["D_accesses"] - b["D_hits"][i]) * ev
        out["Ir"] += b["I_accesses"] * ev
        out["Dref"] += b["D_accesses"] * ev
        found = True
    return out if found else None


def per_request(win: vg.Window) -> dict:
    n = max(1, win.requests)
    t = win.total
    return {
        "Ir": t("Ir") / n,
        "Dref": (t("Dr") + t("Dw")) / n,
        "I1": t("I1mr") / n,
        "D1": (t("D1mr") + t("D1mw")) / n,
        "LL": (t("ILmr") + t("DLmr") + t("DLmw")) / n,
        "Bcm/Bc": t("Bcm") / max(1, t("Bc")),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--configs", default="A")
    ap.add_argument("--knobs", default="tuned")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--out", default="/tmp/curve")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tune", type=int, default=0, help="run the tuning loop (at A) this many iterations first")
    args = ap.parse_args()
    d = Path(args.dir)
    prof = json.loads((d / "private" / "profile.json").read_text())
    skel = json.loads((d / "private" / "skeleton.json").read_text())
    if args.knobs == "tuned":
        knobs = json.loads((d / "private" / "tuning.json").read_text())["knobs"]
    elif args.knobs == "default":
        knobs = dict(gen.DEFAULT_KNOBS)
    else:
        knobs = {**gen.DEFAULT_KNOBS, **json.loads(args.knobs)}
    out = Path(args.out)
    if args.tune:
        tu = tune.tune(prof, out, lambda m: print(m, flush=True), seed=args.seed, max_iter=args.tune, skeleton=skel)
        knobs = tu["knobs"]
        print(f"# tuned: best iteration {tu['best_iteration']}, knobs {json.dumps(knobs)}")
    meta = gen.generate(prof, out, seed=args.seed, knobs=knobs, skeleton=skel)
    gen.build(out)
    for name, t in meta["targets"].items():
        code = sum(b["code_bytes"] for b in t["blocks"])
        print(f"# {name}: {len(t['blocks'])} blocks, {code} B of body code, expected {t['expected_per_event']}")
    val = {}
    vp = d / "private" / "validation.json"
    if vp.exists():
        val = json.loads(vp.read_text()).get("simulated", {})
    port = prof["listen"]["port"]
    load = prof["load"]["args"]
    rows = []
    for c in args.configs.split(","):
        if c in ("A", "B"):
            cfg = vg.CONFIG_A if c == "A" else vg.CONFIG_B
        else:
            s = int(c)
            cfg = {"I1": cache_arg(s), "D1": cache_arg(s), "LL": cache_arg(max(2 * s, 2 << 20))}
        win = vg.window(
            tune.clone_launch(out, port),
            port,
            load,
            prof["valgrind"]["rate"],
            args.requests,
            out / "private" / "work",
            f"curve{c}",
            cache=cfg,
            preload="--preload" in load,
        )
        m = per_request(win)
        o = None
        if c in val:
            om = val[c]["original"]
            ir, dref = om["instructions_per_request"], om["data_refs_per_request"]
            o = {
                "Ir": ir,
                "Dref": dref,
                "I1": om["I1_miss_rate"] * ir,
                "D1": om["D1_miss_rate"] * dref,
                "LL": om["LL_miss_rate"] * (ir + dref),
                "Bcm/Bc": om.get("branch_mispredict_rate", 0.0),
            }
        elif c not in ("A", "B"):
            o = original_at(prof, int(c))
        line = f"{c:>9}: clone " + " ".join(f"{k} {v:9.3f}" for k, v in m.items())
        if o:
            line += "\n           orig  " + " ".join(f"{k} {o[k]:9.3f}" for k in m if k in o)
            line += "\n           err   " + " ".join(f"{k} {100 * (m[k] - o[k]) / o[k]:+8.1f}%" for k in m if o.get(k))
        print(line, flush=True)
        rows.append({"config": c, "clone": m, "original": o})
    (out / "curve.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
