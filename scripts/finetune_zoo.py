#!/usr/bin/env python3
"""The fine-tune zoo benchmark (bench/compile_times.md): N fine-tunes of one architecture (the same graph, every
large weight changed), compiled after the base model into one store, as a team rebuilding its fine-tunes would.

For a base ONNX model: compiles it cold into an empty store (the first build), writes N fine-tunes (every float
initializer of more than 64 elements scaled and shifted by a different factor each, as scripts/change_weights.py
does), then
  - one by one, each fine-tune in a fresh `tessera compile --json` process into the same store: its wall time,
    the stages that executed, and how much the store grew, next to the size of its large weights (as stored:
    fp32, or 2 bytes each for -precision=fp16/bf16 targets);
  - all N again as one manifest in one process into a fresh copy of the base store: total time and growth.
Writes OUT.json (after every fine-tune, so a run cut short keeps its rows) and prints a Markdown summary. Each
fine-tune's artifact is deleted once measured, and its model file too with --no-manifest (N fine-tunes of
BERT-base are N x 435 MB of models, of artifacts, and of store growth: more than a small disk holds at once).
Needs onnx and numpy.

Usage: python3 scripts/finetune_zoo.py TESSERA BASE.onnx WORKDIR OUT.json [--n 20] [--target T ...]
                                        [--shape NAME=DIMS ...] [--costs C] [--no-manifest]
"""
import argparse, json, os, shutil, statistics, subprocess, sys, time

import numpy as np
import onnx
from onnx import numpy_helper


def du(path):
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except FileNotFoundError:
                pass
    return total


def run(cmd):
    t = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}\n{p.stderr[-3000:]}")
    return time.time() - t, p.stdout


def fine_tune(base, path, factor):
    """The base model with every large float initializer changed; returns the changed elements."""
    m = onnx.load(base)
    n = 0
    for t in m.graph.initializer:
        if t.data_type == onnx.TensorProto.FLOAT and int(np.prod(t.dims)) > 64:
            a = numpy_helper.to_array(t).astype(np.float32) * np.float32(factor) + np.float32(0.01)
            t.CopyFrom(numpy_helper.from_array(a, t.name))
            n += a.size
    onnx.save(m, path)
    return n


def executed(summary):
    return sorted(k for k, v in summary["stages"].items() if v["executions"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tessera")
    ap.add_argument("base")
    ap.add_argument("work")
    ap.add_argument("out")
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--target", action="append", default=[])
    ap.add_argument("--shape", action="append", default=[])
    ap.add_argument("--costs", default="measured")
    ap.add_argument("--no-manifest", action="store_true")
    a = ap.parse_args()
    targets = a.target or ["cpu"]
    half = any("fp16" in t or "bf16" in t for t in targets)
    flags = [x for t in targets for x in ("--target", t)] + [x for s in a.shape for x in ("--shape", s)] + ["--costs", a.costs]
    os.makedirs(a.work, exist_ok=True)
    store = os.path.join(a.work, "store")
    shutil.rmtree(store, ignore_errors=True)
    name = os.path.splitext(os.path.basename(a.base))[0]

    cold_s, out = run([a.tessera, "compile", a.base, *flags, "--store", store, "--out", os.path.join(a.work, "out"), "--json", "-q"])
    base_store = du(store)
    snapshot = os.path.join(a.work, "store-base")
    shutil.rmtree(snapshot, ignore_errors=True)
    if not a.no_manifest:
        shutil.copytree(store, snapshot, symlinks=True)
    rows, entries = [], []
    report = {"base": os.path.basename(a.base), "targets": targets, "costs": a.costs, "n": a.n, "cold_s": cold_s,
              "base_store_bytes": base_store, "rows": rows}

    def save():
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)

    for i in range(a.n):
        ft = os.path.join(a.work, f"ft{i:02d}", f"{name}.onnx")
        os.makedirs(os.path.dirname(ft), exist_ok=True)
        elements = fine_tune(a.base, ft, 1.0 + 0.01 * (i + 1))
        weights = elements * (2 if half else 4)
        before = du(store)
        s, out = run([a.tessera, "compile", ft, *flags, "--store", store, "--out", os.path.join(a.work, f"ft{i:02d}", "out"), "--json", "-q"])
        grown = du(store) - before
        summary = json.loads(out)
        rows.append({"fine_tune": i, "seconds": s, "store_growth_bytes": grown, "weights_bytes": weights,
                     "growth_over_weights": grown / weights, "executed": executed(summary)})
        print(json.dumps(rows[-1]), flush=True)
        save()
        shutil.rmtree(os.path.join(a.work, f"ft{i:02d}", "out"))
        if a.no_manifest:
            os.remove(ft)
        entries.append((f"ft{i:02d}", os.path.abspath(ft)))
    secs = [r["seconds"] for r in rows]
    ratio = [r["growth_over_weights"] for r in rows]
    print(f"\n| {name} | cold {cold_s:.1f} s | fine-tune median {statistics.median(secs):.2f} s (min {min(secs):.2f}, max "
          f"{max(secs):.2f}) | store growth / weights median {statistics.median(ratio):.2f} (max {max(ratio):.2f}) | "
          f"executed {sorted(set(s for r in rows for s in r['executed']))} |", flush=True)
    if a.no_manifest:
        return
    # All of them as one manifest, one process, from the base store.
    manifest = os.path.join(a.work, "finetunes.toml")
    with open(manifest, "w") as f:
        for tag, path in entries:
            f.write(f'[[entry]]\nonnx = "{path}"\nname = "{tag}"\n\n')
    store2 = os.path.join(a.work, "store-manifest")
    shutil.rmtree(store2, ignore_errors=True)
    shutil.copytree(snapshot, store2, symlinks=True)
    manifest_s, out = run([a.tessera, "compile", manifest, *flags, "--store", store2, "--out", os.path.join(a.work, "out-manifest"), "--json", "-q"])
    manifest_growth = du(store2) - base_store
    report.update(manifest_s=manifest_s, manifest_store_growth_bytes=manifest_growth, manifest_executed=executed(json.loads(out)))
    save()
    print(f"{a.n} as one manifest: {manifest_s:.1f} s, store growth {manifest_growth / max(1, sum(r['weights_bytes'] for r in rows)):.2f}x "
          f"the fine-tunes' weights")


if __name__ == "__main__":
    main()
