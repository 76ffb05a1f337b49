#!/usr/bin/env python3
"""Warm and weights-changed rebuilds on the GPU machine, next to hashing (bench/compile_times.md, issue 28 items 4 and 5).

Run after scripts/gpu/side_by_side.py, on its WORKDIR: each model's export (`TAG.onnx`) and the store its first
target set compiled into (`store-TAG-0`) are reused, with the same targets, costs and shapes, so every stage is a
hit. Per model, in fresh processes:
  - warm: `tessera compile` into an output folder whose artifact is already in place, ROUNDS times;
  - hashing: blake3 of the model file the way tessera hashes it (`b3hash`, pipeline/examples/b3hash.rs), and
    process start (`tessera --version`), in the same rounds;
  - weights changed: the model's file rewritten with every large initializer changed (scripts/change_weights.py,
    a new factor each time, so nothing was cached), then `tessera compile --json`: its wall time and the
    stages that executed (no lower, compile, tune or time-plans is the point).
Usage: python3 scripts/gpu/rebuild_times.py TESSERA B3HASH WORKDIR OUT.json TAG [TAG ...]
Environment as side_by_side.py: TESSERA_TARGETS (first set used), TESSERA_COSTS, and --precision via PRECISION.
"""
import json, os, shutil, statistics, subprocess, sys, time

import onnx

ROUNDS = 5
CHANGES = 3
HERE = os.path.dirname(os.path.abspath(__file__))
sys.argv, args = sys.argv[:1], sys.argv[1:]
import side_by_side as sbs  # noqa: E402  (its targets() and environment, read at import)

tessera, b3, workdir, out_json, tags = args[0], args[1], args[2], args[3], args[4:]
sbs.PRECISION = os.environ.get("PRECISION", "fp16")


def timed(cmd):
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    dt = time.perf_counter() - t
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {p.stderr[-800:]}")
    return dt, p.stdout


def shapes_of(path):
    m = onnx.load(path, load_external_data=False)
    inits = {i.name for i in m.graph.initializer}
    out = []
    for i in m.graph.input:
        if i.name in inits:
            continue
        dims = [d.dim_value for d in i.type.tensor_type.shape.dim]
        out += ["--shape", f"{i.name}={'x'.join(map(str, dims))}"]
    return out


rows = []
for tag in tags:
    src = os.path.join(workdir, f"{tag}.onnx")
    store = os.path.join(workdir, f"store-{tag}-0")
    base = [a for t in sbs.targets(sbs.COMPILER_SETS[0]) for a in ("--target", t)] + ["--store", store, "--costs", sbs.COSTS] + shapes_of(src)
    row = {"model": tag, "model_bytes": os.path.getsize(src), "targets": sbs.targets(sbs.COMPILER_SETS[0])}
    try:
        out = os.path.join(workdir, f"rb-out-{tag}")
        timed([tessera, "compile", src, "--out", out] + base)  # fills the output folder
        warm, hashing, start = [], [], []
        for _ in range(ROUNDS):
            warm.append(timed([tessera, "compile", src, "--out", out, "-q"] + base)[0])
            hashing.append(timed([b3, src])[0])
            start.append(timed([tessera, "--version"])[0])
        row["warm_s"] = statistics.median(warm)
        row["b3_s"] = statistics.median(hashing)
        row["start_s"] = statistics.median(start)
        row["warm_over_hash_and_start"] = row["warm_s"] / (row["b3_s"] + row["start_s"])
        # Weights changed: the same file name (the job's name), other bytes each time.
        wdir = os.path.join(workdir, f"rb-weights-{tag}")
        os.makedirs(wdir, exist_ok=True)
        path = os.path.join(wdir, f"{tag}.onnx")
        shutil.copyfile(src, path)
        wout = os.path.join(wdir, "out")
        timed([tessera, "compile", path, "--out", wout] + base)
        changed = []
        for k in range(CHANGES):
            subprocess.run([sys.executable, os.path.join(HERE, "..", "change_weights.py"), src, path, str(1.1 + 0.1 * k)], check=True, capture_output=True)
            dt, js = timed([tessera, "compile", path, "--out", wout, "--json"] + base)
            stages = json.loads(js)["stages"]
            ran = {k2: v["executions"] for k2, v in stages.items() if v.get("executions", 0) > 0}
            changed.append({"s": dt, "b3_s": timed([b3, path])[0], "ran": ran, "exec_s": {k2: round(v["exec_micros"] / 1e6, 2) for k2, v in stages.items() if v.get("executions", 0) > 0}})
        row["changed"] = changed
        row["changed_s"] = statistics.median(c["s"] for c in changed)
    except Exception as e:  # a row per model, whatever happens to the others
        row["error"] = str(e)[:400]
    print(json.dumps(row), flush=True)
    rows.append(row)
json.dump(rows, open(out_json, "w"), indent=1)
