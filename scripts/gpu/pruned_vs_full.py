#!/usr/bin/env python3
"""Pruned tuning against full measurement (issue 28 item 2), on the GPU machine.

For one set of inputs: a cold measured build with `--tuning full` and one with `--tuning pruned`, each into an
empty store of its own, the wall time and stage counts of each; then every model's two artifacts timed
alternately (`tessera bench --abba`, CUDA graph replays), where their digests differ (the same digest is the
same plan: ratio 1 by construction).

Usage, from the repository root with the release binary staged in .gpu/bin:
  python3 scripts/gpu/pruned_vs_full.py --label zoo --out $OUT fixtures/zoo.toml
  python3 scripts/gpu/pruned_vs_full.py --label big --out $OUT fixture:resnet50:b32 fixture:bert-base:b8:s128
Writes OUT/pruned_vs_full_<label>.json and prints a table.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

# The default GPU backends in fp16; PRUNE_TARGETS ("t1;t2") replaces them (a CPU check of the script).
TARGETS = [t for t in os.environ.get("PRUNE_TARGETS", "").split(";") if t] or [
    "cuda -compiler=nvrtc -precision=fp16",
    "cuda -compiler=cublas -precision=fp16",
    "cuda -compiler=cudnn -precision=fp16",
]


def compile_cold(binary, inputs, name, mode, work):
    store, out = os.path.join(work, f"store-{name}"), os.path.join(work, f"out-{name}")
    cmd = [binary, "compile", *inputs, "--store", store, "--out", out, "--tuning", mode, "--json", "-q"]
    for t in TARGETS:
        cmd += ["--target", t]
    start = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.monotonic() - start
    if done.returncode != 0:
        sys.exit(f"{mode} build failed:\n{done.stderr[-4000:]}")
    summary = json.loads(done.stdout)
    return wall, summary, out


def bench(binary, a, b, iters):
    cmd = [binary, "bench", "--abba", "--iters", str(iters), "--warmup", "20", "--json", "-q", a, b]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"bench failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("inputs", nargs="+")
    ap.add_argument("--label", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tessera", default=".gpu/bin/tessera")
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--noise", action="store_true", help="a second full build, timed against the first: what two full builds differ by")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="pruned-vs-full-")
    builds = {}
    runs = [("full", "full"), ("pruned", "pruned")] + ([("full-again", "full")] if args.noise else [])
    for name, mode in runs:
        wall, summary, out = compile_cold(args.tessera, args.inputs, name, mode, work)
        builds[name] = {"wall_s": wall, "summary": summary, "out": out}
        st = summary["stages"]
        print(f"{name}: cold build {wall:.1f} s; tune executions {st.get('tune', {}).get('executions', 0)}, "
              f"lowerings {st.get('lower', {}).get('executions', 0)}, partitions {summary['partitions']}", flush=True)
    rows = []
    full_arts = {a["model"]: a for a in builds["full"]["summary"]["artifacts"]}
    for other in [n for n, _ in runs[1:]]:
        for a in builds[other]["summary"]["artifacts"]:
            f = full_arts[a["model"]]
            row = {"model": a["model"], "against": other, "full_digest": f.get("digest"), "other_digest": a.get("digest")}
            if row["full_digest"] == row["other_digest"]:
                row.update(same_plan=True, ratio=1.0)
            else:
                res = bench(args.tessera, f["path"], a["path"], args.iters)
                med = [r["median_ms"] for r in res["results"]]
                row.update(same_plan=False, full_ms=med[0], other_ms=med[1], ratio=med[1] / med[0])
            rows.append(row)
            print(json.dumps(row), flush=True)
    report = {
        "label": args.label,
        "inputs": args.inputs,
        "targets": TARGETS,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "builds": {m: {"wall_s": b["wall_s"], "stages": b["summary"]["stages"], "partitions": b["summary"]["partitions"]} for m, b in builds.items()},
        "models": rows,
    }
    with open(os.path.join(args.out, f"pruned_vs_full_{args.label}.json"), "w") as fh:
        json.dump(report, fh, indent=1)


if __name__ == "__main__":
    main()
