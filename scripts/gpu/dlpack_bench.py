"""Serving a GPU artifact from Python with torch tensors (issue 30): the GPU row of bench/runtime.md.

Usage (on the GPU machine, the wheel's `tessera` package importable, torch with CUDA):
  python3 scripts/gpu/dlpack_bench.py TESSERA_BINARY REPORT.md ARTIFACT.tsr...

For each artifact, the median latency of one run, in microseconds, after 20 warm-up runs, over 200 runs:
- `tessera bench`: the artifact's CUDA graph replayed with its inputs already on the device, timed with CUDA
  events: the GPU's own time, the floor under every API;
- NumPy: `Model.run({name: ndarray})` (host arrays in, new arrays out: two host-device copies a run);
- torch, synchronous: `Model.run(gpu tensors, out=gpu tensors)`: no host copy; the run waits for the device's
  work first and returns when the outputs are written (wall clock around the call);
- torch on a stream: `Model.run(..., stream=s)` then `s.synchronize()` (wall clock around both), and the
  throughput figure: 200 runs enqueued back to back on the stream, one synchronization, CUDA events around them.
Inputs: float inputs standard normal, integer inputs 0/1 (masks and token ids alike), drawn once.
"""

import json
import statistics
import subprocess
import sys
import time

import numpy as np
import torch

import tessera

WARMUP, ITERS = 20, 200


def median_us(fn):
    for _ in range(WARMUP):
        fn()
    times = []
    for _ in range(ITERS):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def bench_cli(binary, path):
    out = subprocess.run([binary, "bench", path, "--iters", str(ITERS), "--warmup", str(WARMUP), "--json"], check=True,
                         capture_output=True, text=True).stdout
    r = json.loads(out)["results"][0]
    assert r["timing"] == "gpu", r
    return r["median_ms"] * 1e3


def main():
    binary, report, paths = sys.argv[1], sys.argv[2], sys.argv[3:]
    rows = []
    for path in paths:
        m = tessera.load(path)
        rng = np.random.default_rng(0)
        host = {}
        for name, dtype, shape in m.inputs:
            host[name] = rng.standard_normal(shape).astype(dtype) if dtype.startswith("float") else rng.integers(0, 2, size=shape).astype(dtype)
        dev = {k: torch.from_numpy(v).cuda() for k, v in host.items()}
        out = {name: torch.empty(shape, dtype=getattr(torch, dtype), device="cuda") for name, dtype, shape in m.outputs}
        want = m.run(host)
        m.run(dev, out=out)
        for k in want:
            assert np.array_equal(out[k].cpu().numpy(), want[k]), f"{path}: {k} differs between the torch and NumPy runs"
        s = torch.cuda.Stream()
        handle = s.cuda_stream
        cli = bench_cli(binary, path)
        numpy_us = median_us(lambda: m.run(host))
        sync_us = median_us(lambda: m.run(dev, out=out))

        def on_stream():
            m.run(dev, out=out, stream=handle)
            s.synchronize()

        stream_us = median_us(on_stream)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(WARMUP):
            m.run(dev, out=out, stream=handle)
        s.synchronize()
        start.record(s)
        for _ in range(ITERS):
            m.run(dev, out=out, stream=handle)
        end.record(s)
        s.synchronize()
        queued_us = start.elapsed_time(end) * 1e3 / ITERS
        rows.append((m.name, cli, numpy_us, sync_us, stream_us, queued_us))
        print(rows[-1], flush=True)
    gpu = torch.cuda.get_device_name(0)
    with open(report, "w") as f:
        f.write(f"GPU: {gpu}; torch {torch.__version__}; {time.strftime('%Y-%m-%d', time.gmtime())}; made by "
                f"scripts/gpu/dlpack_bench.py ({WARMUP} warm-up runs, medians of {ITERS}).\n\n")
        f.write("| model | tessera bench (graph replay, CUDA events) us | Python NumPy us | Python torch GPU, synchronous us | "
                "Python torch GPU, on a stream us | on a stream, back to back us/run |\n|---|---:|---:|---:|---:|---:|\n")
        for r in rows:
            f.write(f"| {r[0]} | " + " | ".join(f"{x:.1f}" for x in r[1:]) + " |\n")


if __name__ == "__main__":
    main()
