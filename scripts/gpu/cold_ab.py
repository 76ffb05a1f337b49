#!/usr/bin/env python3
"""Cold compile of two tessera binaries, alternated, with the stage profile of each build (issue 28 item 3).

Each build is a fresh process into an empty store, measured costs, the default GPU backends in fp16, with
NVRTC's cache in the driver's compute cache off (`CUDA_CACHE_DISABLE=1`; see side_by_side.py's COLD_ENV:
without it, every build after the first of a model finds its whole-plan modules compiled). Rounds alternate
the order of the binaries (A B, then B A, ...) so that neither always runs first.

Usage, on the GPU machine from the repository root:
  python3 scripts/gpu/cold_ab.py --a .gpu/bin/tessera-base --b .gpu/bin/tessera --rounds 2 \\
      --out $OUT fixture:resnet50:b1 fixture:bert-base:b8
Prints one line per build (wall seconds, stage execution seconds, the tune stage's measuring profile) and
writes OUT/cold_ab.json with all of them. Keep OUT to a few files: the device tool returns only a handful.
"""
import argparse
import json
import os
import re
import subprocess
import tempfile
import time

TARGETS = [
    "cuda -compiler=nvrtc -precision=fp16",
    "cuda -compiler=cublas -precision=fp16",
    "cuda -compiler=cudnn -precision=fp16",
]

# The tune stage's line per measuring call (tune.rs, `on_every_gpu`).
MEASURED = re.compile(r"tune: (\d+) kernels measured.*?setup_seconds=([0-9.eE+-]+) launches_seconds=([0-9.eE+-]+) capture_seconds=([0-9.eE+-]+) timing_seconds=([0-9.eE+-]+)")


def build(binary, model):
    work = tempfile.mkdtemp()
    cmd = [binary, "compile", model, "--store", f"{work}/store", "--out", f"{work}/out", "--json"]
    for t in TARGETS:
        cmd += ["--target", t]
    env = dict(os.environ, CUDA_CACHE_DISABLE="1", TESSERA_LOG="info")
    start = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.monotonic() - start
    if done.returncode != 0:
        raise SystemExit(f"{binary} {model} failed:\n{done.stderr[-3000:]}")
    summary = json.loads(done.stdout)
    stages = {k: round(v["exec_micros"] / 1e6, 2) for k, v in summary["stages"].items()}
    profile = [0.0] * 4
    for m in MEASURED.finditer(done.stderr):
        for i in range(4):
            profile[i] += float(m.group(i + 2))
    return {
        "binary": binary,
        "model": model,
        "wall_s": round(wall, 2),
        "stages_s": stages,
        "tune_executions": summary["stages"].get("tune", {}).get("executions", 0),
        "measuring_s": dict(zip(["setup", "launches", "capture", "timing"], [round(p, 2) for p in profile])),
        "digests": [a["digest"] for a in summary["artifacts"]],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True)
    ap.add_argument("--b", required=True)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", required=True)
    ap.add_argument("models", nargs="+")
    args = ap.parse_args()
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    rows = []
    for r in range(args.rounds):
        for model in args.models:
            order = [args.a, args.b] if r % 2 == 0 else [args.b, args.a]
            for binary in order:
                row = build(binary, model)
                row["round"] = r + 1
                rows.append(row)
                print(f"r{r + 1} {model} {os.path.basename(binary)}: {row['wall_s']} s, stages {row['stages_s']}, measuring {row['measuring_s']}", flush=True)
    with open(os.path.join(args.out, "cold_ab.json"), "w") as f:
        json.dump({"gpu": gpu, "date": time.strftime("%Y-%m-%d"), "targets": TARGETS, "builds": rows}, f, indent=1)


if __name__ == "__main__":
    main()
