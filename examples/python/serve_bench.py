"""Serving figures of the Python API (scripts/bench_runtime.sh runs it; bench/runtime.md has the results).

    python serve_bench.py MODEL.tsr INDIR ITERS WARMUP SECONDS

Reads input i from INDIR/i.bin (raw little-endian bytes), then prints one JSON line: the median (p10, p90) of
ITERS timed `model.run({...})` calls on one thread after WARMUP untimed ones (outputs are new NumPy arrays
each run, as the API returns them), and runs per second with 1, 2 and 4 Python threads on the one loaded
model, each looping for SECONDS (the GIL is released while a run executes). The same measurement as
examples/rust/serve_bench.rs and examples/c/serve_bench.c.
"""

import json
import sys
import threading
import time

import numpy as np

import tessera


def quantile(sorted_values, q):
    """Linear interpolation between order statistics (NumPy's default, as `tessera bench` computes it)."""
    return float(np.quantile(np.asarray(sorted_values), q))


def throughput(model, inputs, threads, seconds):
    start_line = threading.Barrier(threads + 1)
    stop = threading.Event()
    runs = [0] * threads
    ends = [0.0] * threads

    def work(t):
        model.run(inputs)  # untimed: the thread's session exists before the clock starts
        start_line.wait()
        n = 0
        while not stop.is_set():
            model.run(inputs)
            n += 1
        runs[t], ends[t] = n, time.perf_counter()

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    start_line.wait()
    start = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for w in workers:
        w.join()
    return sum(runs) / (max(ends) - start)


def main():
    if len(sys.argv) != 6:
        sys.exit("usage: serve_bench.py MODEL.tsr INDIR ITERS WARMUP SECONDS")
    path, indir = sys.argv[1], sys.argv[2]
    iters, warmup, seconds = int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
    if iters < 1:
        sys.exit("ITERS must be at least 1")
    model = tessera.load(path)
    inputs = {name: np.fromfile(f"{indir}/{i}.bin", dtype=dtype).reshape(shape) for i, (name, dtype, shape) in enumerate(model.inputs)}
    for _ in range(warmup):
        model.run(inputs)
    us = []
    for _ in range(iters):
        t = time.perf_counter()
        model.run(inputs)
        us.append((time.perf_counter() - t) * 1e6)
    us.sort()
    line = {"api": "python", "model": model.name, "iters": iters, "median_us": round(quantile(us, 0.5), 2), "p10_us": round(quantile(us, 0.1), 2), "p90_us": round(quantile(us, 0.9), 2)}
    for threads in (1, 2, 4):
        line[f"runs_per_s_{threads}"] = round(throughput(model, inputs, threads, seconds), 1)
    print(json.dumps(line))


if __name__ == "__main__":
    main()
