#!/usr/bin/env python3
"""Many processes on one store (issue 29): eight `tessera compile` processes with overlapping zoos.

Runs, each on fresh stores, and prints a markdown table for bench/store.md:
  one      one process compiling the union of the eight zoos (the same distinct work, each artifact written
           out once: a lower bound);
  serial   the eight processes one after another on one store (what `--wait` queueing gave before the
           store was shared: the same work and the same artifact files written out);
  shared   the eight processes at once on one store (single flight through local leases);
  separate the eight processes at once, each on its own store (no sharing: every overlap recomputed).
For each: wall time, stage executions summed over the processes' `--json` summaries, and the memo entries
the store(s) hold. While `shared` runs, `tessera store stats --json` runs every 0.2 s and its latency is
recorded (readers must never wait for writers).

Usage: scripts/bench_store_processes.py [--bin PATH] [--rounds N]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

MODELS = {
    "mlp3-b1": 'model = "mlp3"\nbatch = 1\n',
    "mlp3-b8": 'model = "mlp3"\nbatch = 8\n',
    "resnet18": 'model = "resnet18"\nbatch = 1\n',
    "bert-tiny": 'model = "bert-tiny"\nbatch = 1\nseq = 128\n',
    "mobilenetv2": 'model = "mobilenetv2"\nbatch = 1\n',
}
ZOOS = [
    ["mlp3-b1", "resnet18"],
    ["resnet18", "bert-tiny"],
    ["bert-tiny", "mobilenetv2"],
    ["mobilenetv2", "mlp3-b8"],
    ["mlp3-b8", "mlp3-b1", "resnet18"],
    ["bert-tiny", "mlp3-b1"],
    ["mobilenetv2", "resnet18"],
    ["mlp3-b1", "mlp3-b8", "bert-tiny", "mobilenetv2"],
]


def manifest(dir: Path, name: str, models) -> Path:
    p = dir / f"{name}.toml"
    p.write_text("\n".join(f"[[entry]]\n{MODELS[m]}" for m in models))
    return p


def compile_cmd(binary, m: Path, store: Path, out: Path):
    return [binary, "compile", str(m), "--costs", "analytical", "--store", str(store), "--out", str(out), "--json", "-q"]


def executions(stdout: str) -> int:
    return sum(s["executions"] for s in json.loads(stdout)["stages"].values())


def entries(binary, store: Path) -> int:
    out = subprocess.run([binary, "store", "stats", "--json", "--store", str(store)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["memo_entries"]


def run_many(binary, t: Path, stores, reader_store=None):
    """Starts the eight compiles at once; returns (wall, executions, reader latencies)."""
    latencies, stop = [], threading.Event()

    def reader():
        while not stop.is_set():
            time.sleep(0.2)
            start = time.perf_counter()
            r = subprocess.run([binary, "store", "stats", "--json", "--store", str(reader_store)], capture_output=True, text=True)
            if r.returncode == 0:
                latencies.append(time.perf_counter() - start)
            elif "no store here yet" not in r.stderr:
                sys.exit(f"a reader failed while the compiles wrote: {r.stderr}")

    start = time.perf_counter()
    procs = [
        subprocess.Popen(compile_cmd(binary, manifest(t, f"zoo{i}", z), stores[i], t / f"out{i}"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i, z in enumerate(ZOOS)
    ]
    th = None
    if reader_store is not None:
        th = threading.Thread(target=reader)
        th.start()
    total = 0
    for p in procs:
        out, err = p.communicate()
        if p.returncode != 0:
            sys.exit(f"compile failed: {err}")
        total += executions(out)
    wall = time.perf_counter() - start
    stop.set()
    if th:
        th.join()
    return wall, total, latencies


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.environ.get("TESSERA_BIN", "target/release/tessera"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", choices=["one", "serial", "shared", "separate"], nargs="*")
    a = ap.parse_args()
    binary = str(Path(a.bin).resolve())
    rows = {"one": [], "serial": [], "shared": [], "separate": []}
    facts = {}
    lat = []
    for r in range(a.rounds):
        with tempfile.TemporaryDirectory() as d:
            t = Path(d)
            union = sorted({m for z in ZOOS for m in z})
            start = time.perf_counter()
            out = subprocess.run(compile_cmd(binary, manifest(t, "union", union), t / "one", t / "out-one"), capture_output=True, text=True, check=True)
            rows["one"].append(time.perf_counter() - start)
            facts["one"] = (executions(out.stdout), entries(binary, t / "one"))
            start = time.perf_counter()
            ex = 0
            for i, z in enumerate(ZOOS):
                out = subprocess.run(compile_cmd(binary, manifest(t, f"zoo{i}", z), t / "serial", t / f"out-serial{i}"), capture_output=True, text=True, check=True)
                ex += executions(out.stdout)
            rows["serial"].append(time.perf_counter() - start)
            facts["serial"] = (ex, entries(binary, t / "serial"))
            wall, ex, latencies = run_many(binary, t, [t / "shared"] * len(ZOOS), reader_store=t / "shared")
            rows["shared"].append(wall)
            facts["shared"] = (ex, entries(binary, t / "shared"))
            lat += latencies
            seps = [t / f"sep{i}" for i in range(len(ZOOS))]
            wall, ex, _ = run_many(binary, t, seps)
            rows["separate"].append(wall)
            facts["separate"] = (ex, sum(entries(binary, s) for s in seps))
            print(f"round {r}: one {rows['one'][-1]:.2f} s, serial {rows['serial'][-1]:.2f} s, shared {rows['shared'][-1]:.2f} s, separate {rows['separate'][-1]:.2f} s", file=sys.stderr)
    base = statistics.median(rows["one"])
    print("| run | wall (median s) | vs one process | stage executions | memo entries held |")
    print("|---|---:|---:|---:|---:|")
    names = {"one": "one process, the union of the zoos", "serial": "eight processes one after another, one store", "shared": "eight processes, one shared store", "separate": "eight processes, eight stores"}
    for k in ["one", "serial", "shared", "separate"]:
        w = statistics.median(rows[k])
        ex, held = facts[k]
        print(f"| {names[k]} | {w:.2f} | {w / base:.2f}x | {ex} | {held} |")
    if lat:
        lat.sort()
        print(f"\n`tessera store stats` while the eight wrote: {len(lat)} runs, median {statistics.median(lat) * 1e3:.0f} ms, max {lat[-1] * 1e3:.0f} ms (each run is a process start, an open and a scan of the store).")


if __name__ == "__main__":
    main()
