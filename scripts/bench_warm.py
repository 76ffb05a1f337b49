#!/usr/bin/env python3
"""Warm-rebuild timings for bench/compile_times.md: wall time of whole `tessera compile` processes against a warm
store, next to blake3 of the same model files (`b3hash`, the way tessera hashes them) and process start
(`tessera --version`); several binaries interleaved round by round, so a shared machine's load hits them alike.

Usage: scripts/bench_warm.py --store DIR --b3 target/release/examples/b3hash [--rounds 8]
           --bin before=/path/to/tessera-before --bin after=target/release/tessera
           [--zoo fixtures/zoo.toml] [--onnx a.onnx b.onnx ...] [--out-root /tmp/bench-warm]

Every binary writes to its own output folders (the provenance each stamps differs), filled by one untimed run
first, so the timed runs find their artifacts in place. ONNX models compile with `--costs analytical`.
"""
import argparse, collections, pathlib, statistics, subprocess, time

ap = argparse.ArgumentParser()
ap.add_argument("--store", required=True)
ap.add_argument("--b3", required=True)
ap.add_argument("--bin", action="append", required=True, help="NAME=PATH")
ap.add_argument("--zoo", default="fixtures/zoo.toml")
ap.add_argument("--onnx", nargs="*", default=[])
ap.add_argument("--rounds", type=int, default=8)
ap.add_argument("--out-root", default="/tmp/bench-warm")
a = ap.parse_args()
bins = [b.split("=", 1) for b in a.bin]
root = pathlib.Path(a.out_root)

def cases(name, path):
    c = {"version": [path, "--version"], "zoo": [path, "compile", a.zoo, "--store", a.store, "--out", str(root / name / "zoo"), "-q"]}
    if a.onnx:
        c["onnx"] = [path, "compile", *a.onnx, "--costs", "analytical", "--store", a.store, "--out", str(root / name / "onnx"), "-q"]
    return c

hashes = {"b3 zoo manifest": [a.b3, a.zoo]}
if a.onnx:
    hashes["b3 onnx files"] = [a.b3, *a.onnx]

times = collections.defaultdict(list)
def run(label, cmd, timed=True):
    t = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    if timed:
        times[label].append(time.perf_counter() - t)

for name, path in bins:
    for label, cmd in cases(name, path).items():
        run(label, cmd, timed=False)
for _ in range(a.rounds):
    for name, path in bins:
        for label, cmd in cases(name, path).items():
            run(f"{name} {label}", cmd)
    for label, cmd in hashes.items():
        run(label, cmd)
for label, v in sorted(times.items()):
    print(f"{label:28s} median {statistics.median(v) * 1e3:9.1f} ms   min {min(v) * 1e3:9.1f} ms   (n={len(v)})")
