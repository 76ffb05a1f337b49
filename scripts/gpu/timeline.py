#!/usr/bin/env python3
"""Where a cold compile spends its time, line by line (bench/compile_times.md): each model exported as side_by_side.py
exports it, then `tessera compile` cold (an empty store, `CUDA_CACHE_DISABLE=1`) with the tune and stage logs
on, every log line prefixed with the seconds since the process started.

Usage: python3 scripts/gpu/timeline.py TESSERA WORKDIR OUT_DIR MODEL [MODEL ...]
Environment as side_by_side.py: TESSERA_TARGETS (first set), TESSERA_COSTS; PRECISION (default fp16).
"""
import os, subprocess, sys, time

sys.argv, args = sys.argv[:1], sys.argv[1:]
import side_by_side as sbs  # noqa: E402

tessera, workdir, out_dir, names = args[0], args[1], args[2], args[3:]
sbs.PRECISION = os.environ.get("PRECISION", "fp16")
os.makedirs(workdir, exist_ok=True)
os.makedirs(out_dir, exist_ok=True)
import torch  # noqa: E402

for name in names:
    model, inputs, in_names = sbs.build(name, torch)
    path = os.path.join(workdir, f"{name}.onnx")
    sbs.export(model, inputs, in_names, path, torch)
    shapes = sum((["--shape", f"{n}={'x'.join(map(str, a.shape))}"] for n, a in zip(in_names, inputs)), [])
    store = os.path.join(workdir, f"timeline-store-{name}")
    cmd = [tessera, "compile", path, "--store", store, "--out", os.path.join(workdir, f"timeline-out-{name}"), "--costs", sbs.COSTS]
    cmd += [a for t in sbs.targets(sbs.COMPILER_SETS[0]) for a in ("--target", t)] + shapes
    env = dict(sbs.COLD_ENV, TESSERA_LOG="info,tessera_stages=debug")
    start = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    with open(os.path.join(out_dir, f"{name}_timeline.txt"), "w") as f:
        for line in p.stdout:
            f.write(f"{time.perf_counter() - start:7.2f} {line}")
    p.wait()
    print(f"{name}: {time.perf_counter() - start:.1f} s, exit {p.returncode}", flush=True)
