#!/usr/bin/env python3
"""Warm GPU rebuilds of two tessera binaries, alternated in one run (bench/compile_times.md, issue 28 item 4).

For each binary: a cold measured build of INPUT into a store of its own (fresh process, NVRTC's driver cache
off), then ROUNDS warm builds of each, alternating A and B, each a fresh process into an output folder whose
artifact is already in place; process start (`tessera --version`) and the driver's own start (`cuInit` and a
device count, from Python) in the same rounds. Last, one warm build of each binary with `-vvv`, every log line
stamped with the seconds since the process started (`OUT/warm_timeline_{a,b}.txt`).

Usage: python3 scripts/gpu/warm_ab.py A_BINARY B_BINARY OUT_DIR [INPUT] [--target T ...]
Default INPUT fixture:bert-base:b8, default targets the GPU set in fp16 (`nvrtc`, `cublas`, `cudnn`).
"""
import json, os, statistics, subprocess, sys, tempfile, time

ROUNDS = 6
args = sys.argv[1:]
targets = []
while "--target" in args:
    i = args.index("--target")
    targets.append(args[i + 1])
    del args[i:i + 2]
a_bin, b_bin, out = args[:3]
model = args[3] if len(args) > 3 else "fixture:bert-base:b8"
targets = targets or [f"cuda -compiler={c} -precision=fp16" for c in ("nvrtc", "cublas", "cudnn")]
os.makedirs(out, exist_ok=True)
work = tempfile.mkdtemp(prefix="warm-ab-")


def build(binary, tag, extra=(), env=None):
    cmd = [binary, "compile", model, "--store", f"{work}/store-{tag}", "--out", f"{work}/out-{tag}"] + [x for t in targets for x in ("--target", t)] + list(extra)
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    dt = time.perf_counter() - t
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{p.stderr[-1500:]}")
    return dt, p


cold = {}
for tag, binary in (("a", a_bin), ("b", b_bin)):
    cold[tag] = build(binary, tag, env=dict(os.environ, CUDA_CACHE_DISABLE="1"))[0]
    print(f"{tag}: cold {cold[tag]:.2f} s", flush=True)

probe = "import ctypes,time;t=time.perf_counter();c=ctypes.CDLL('libcuda.so.1');c.cuInit(0);n=ctypes.c_int();c.cuDeviceGetCount(ctypes.byref(n));print(time.perf_counter()-t)"
warm = {"a": [], "b": []}
start, cu_init = [], []
for r in range(ROUNDS):
    for tag, binary in ((("a", a_bin), ("b", b_bin)) if r % 2 == 0 else (("b", b_bin), ("a", a_bin))):
        dt, p = build(binary, tag, ["--json"])
        executed = sum(s["executions"] for s in json.loads(p.stdout)["stages"].values())
        if executed:
            raise RuntimeError(f"{tag}: a warm build executed {executed} stages")
        warm[tag].append(dt)
    t = time.perf_counter()
    subprocess.run([b_bin, "--version"], capture_output=True, check=True)
    start.append(time.perf_counter() - t)
    cu_init.append(float(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout))

for tag, binary in (("a", a_bin), ("b", b_bin)):
    cmd = [binary, "compile", model, "--store", f"{work}/store-{tag}", "--out", f"{work}/out-{tag}", "-vvv"] + [x for t in targets for x in ("--target", t)]
    lines, t0 = [], time.perf_counter()
    p = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=dict(os.environ, TESSERA_LOG="debug"))
    for line in p.stderr:
        lines.append("%7.3f %s" % (time.perf_counter() - t0, line.rstrip()[:300]))
    p.wait()
    lines.append("%7.3f exit" % (time.perf_counter() - t0))
    with open(os.path.join(out, f"warm_timeline_{tag}.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")

result = {
    "date": time.strftime("%Y-%m-%d"),
    "input": model,
    "targets": targets,
    "binaries": {"a": a_bin, "b": b_bin},
    "cold_s": cold,
    "warm_s": warm,
    "warm_median_s": {k: statistics.median(v) for k, v in warm.items()},
    "process_start_s": start,
    "cuinit_s": cu_init,
    "facts": sorted(os.listdir(f"{work}/store-b/machine")) if os.path.isdir(f"{work}/store-b/machine") else [],
}
with open(os.path.join(out, "warm_ab.json"), "w") as f:
    json.dump(result, f, indent=1)
print(json.dumps({k: result[k] for k in ("cold_s", "warm_median_s", "warm_s", "process_start_s", "cuinit_s")}, indent=1))
