#!/usr/bin/env python3
"""Tuning on every GPU of the host (issue 28 item 1), on a GPU machine with one or more GPUs.

For each GPU set (`--sets 0 0,1 0,1,2,3`, those the machine has): a cold measured build of the inputs with
`--gpus SET` into an empty store of its own, in a fresh process. Reported per set: the build's wall time, the
tune stage's measuring time (the sum of its `tune: N kernels measured on K GPU(s)` log lines, the part that
runs on every GPU at once; from 1c394a6 on it includes the compiles the measurements overlap), the kernels each GPU measured, the tune executions, and the artifacts' digests.
Scaling of the measuring part against one GPU: `t1 / (k * tk)`, 1.0 being linear.

Usage, from the repository root with the release binary staged in .gpu/bin:
  python3 scripts/gpu/multi_gpu.py --out $OUT --label zoo fixtures/zoo.toml
Writes OUT/multi_gpu_<label>.json and prints a table.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

TARGETS = [t for t in os.environ.get("MULTI_GPU_TARGETS", "").split(";") if t] or [
    "cuda -compiler=nvrtc -precision=fp16",
    "cuda -compiler=cublas -precision=fp16",
    "cuda -compiler=cudnn -precision=fp16",
]

MEASURED = re.compile(r"tune: (\d+) kernels measured on (\d+) GPU\(s\) \(([^)]*)\).*loading_seconds=([0-9.eE+-]+).*seconds=([0-9.eE+-]+)")
COMPILED = re.compile(r"tune: (\d+) kernels for .* compiled as (\d+) modules in ([0-9.]+) s")


def gpu_count():
    done = subprocess.run(["nvidia-smi", "--list-gpus"], capture_output=True, text=True)
    return len([l for l in done.stdout.splitlines() if l.startswith("GPU ")]) if done.returncode == 0 else 0


def cold_build(binary, inputs, gpus, tuning, work):
    tag = gpus.replace(",", "")
    store, out = os.path.join(work, f"store-{tag}"), os.path.join(work, f"out-{tag}")
    cmd = [binary, "compile", *inputs, "--store", store, "--out", out, "--gpus", gpus, "--tuning", tuning, "--json"]
    for t in TARGETS:
        cmd += ["--target", t]
    # NVRTC's own cache in the driver's compute cache off: a cold build compiles everything (see
    # side_by_side.py's COLD_ENV).
    env = dict(os.environ, TESSERA_LOG="info,tessera::tune=debug", CUDA_CACHE_DISABLE="1")
    start = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.monotonic() - start
    if done.returncode != 0:
        sys.exit(f"build on GPUs {gpus} failed:\n{done.stderr[-4000:]}")
    summary = json.loads(done.stdout)
    measuring, loading, compiling, per_gpu, rounds = 0.0, 0.0, 0.0, {}, 0
    for line in done.stderr.splitlines():
        c = COMPILED.search(line)
        if c:
            compiling += float(c.group(3))
        m = MEASURED.search(line)
        if not m:
            continue
        rounds += 1
        loading += float(m.group(4))
        measuring += float(m.group(5))
        for part in m.group(3).split(","):
            g, n = part.strip().removeprefix("GPU ").split(":")
            per_gpu[g] = per_gpu.get(g, 0) + int(n)
    stages = summary.get("stages", {})
    return {
        "gpus": gpus,
        "wall_s": round(wall, 2),
        "measuring_s": round(measuring, 2),
        "loading_s_summed_over_gpus": round(loading, 2),
        "tune_compiling_s": round(compiling, 2),
        "measuring_calls": rounds,
        "kernels_by_gpu": per_gpu,
        "tune_executions": stages.get("tune", {}).get("executions"),
        "artifacts": {a["model"]: a["digest"] for a in summary.get("artifacts", [])},
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--label", required=True)
    ap.add_argument("--binary", default=".gpu/bin/tessera")
    ap.add_argument("--tuning", default="pruned")
    ap.add_argument("--sets", nargs="+", default=["0", "0,1", "0,1,2,3"])
    ap.add_argument("inputs", nargs="+")
    a = ap.parse_args()
    n = gpu_count()
    sets = [s for s in a.sets if max(int(g) for g in s.split(",")) < n]
    print(f"{n} GPU(s); sets {sets}; targets {TARGETS}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for s in sets:
            row = cold_build(a.binary, a.inputs, s, a.tuning, work)
            rows.append(row)
            print(json.dumps(row), flush=True)
    base = next((r for r in rows if r["gpus"] == "0"), None)
    print(f"\n| GPUs | cold build s | measuring s | scaling of measuring | kernels by GPU | tune executions |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        k = len(r["gpus"].split(","))
        scaling = base["measuring_s"] / (k * r["measuring_s"]) if base and r["measuring_s"] > 0 else None
        r["measuring_scaling"] = round(scaling, 3) if scaling else None
        print(f"| {r['gpus']} | {r['wall_s']:.1f} | {r['measuring_s']:.1f} | {scaling:.2f} | {r['kernels_by_gpu']} | {r['tune_executions']} |" if scaling else
              f"| {r['gpus']} | {r['wall_s']:.1f} | {r['measuring_s']:.1f} | - | {r['kernels_by_gpu']} | {r['tune_executions']} |")
    same = [r["gpus"] for r in rows if base and r["artifacts"] == base["artifacts"]]
    print(f"\nartifacts byte-identical to one GPU's: {same}")
    with open(os.path.join(a.out, f"multi_gpu_{a.label}.json"), "w") as f:
        json.dump({"targets": TARGETS, "tuning": a.tuning, "inputs": a.inputs, "gpu_count": n, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
