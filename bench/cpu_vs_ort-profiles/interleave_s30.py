"""Session 30's interleaved timing (bench/cpu_vs_ort.md): per round ORT (15 runs, 2 threads), then two tessera
builds' artifacts with `tessera bench` (15 runs each), the builds' order alternating. Kept as it was run: it
reads ONNX exports from /tmp/ortw/base, binaries /tmp/tessera-{base,new3} and their artifacts under
/tmp/ortw/{base,new3}, as scripts/cpu_vs_ort.py left them. Run pinned: taskset -c 0-1 python3 interleave_s30.py
mobilenetv2-b8 6."""
import json, subprocess, sys, time, statistics
sys.path.insert(0, "/work/main/scripts"); sys.path.insert(0, "/work/main/scripts/gpu")
import numpy as np, onnxruntime as ort
model, rounds = sys.argv[1], int(sys.argv[2])
so = ort.SessionOptions(); so.intra_op_num_threads = 2; so.inter_op_num_threads = 1
so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
sess = ort.InferenceSession(f"/tmp/ortw/base/{model}.onnx", so, providers=["CPUExecutionProvider"])
x = np.random.default_rng(7).uniform(-1, 1, size=(8, 3, 224, 224)).astype(np.float32)
def ort_ms(n=15):
    for _ in range(2): sess.run(None, {"input": x})
    ts = []
    for _ in range(n):
        t = time.perf_counter(); sess.run(None, {"input": x}); ts.append((time.perf_counter() - t) * 1e3)
    return (statistics.median(ts), min(ts))
def tsr_ms(who, n=15):
    out = subprocess.run(["/tmp/tessera-" + who, "bench", "--iters", str(n), "--warmup", "2", "--threads", "2", "--json",
                          f"/tmp/ortw/{who}/{model}-art/{model}.tsr"], capture_output=True, text=True, check=True).stdout
    j = json.loads(out)
    return (j["results"][0]["median_ms"], j["results"][0]["min_ms"])
rows = []
for r in range(rounds):
    order = ["base", "new3"] if r % 2 == 0 else ["new3", "base"]
    row = {"ort": ort_ms()}
    for who in order: row[who] = tsr_ms(who)
    rows.append(row)
    print(json.dumps({k: [round(v[0], 2), round(v[1], 2)] for k, v in row.items()}), flush=True)
for k in ["ort", "base", "new3"]:
    print(k, "median of medians", round(statistics.median(r[k][0] for r in rows), 2), "min of mins", round(min(r[k][1] for r in rows), 2))
for k in ["base", "new3"]:
    print(f"ratio {k}/ort: of min-of-mins", round(min(r[k][1] for r in rows) / min(r["ort"][1] for r in rows), 3),
          "median per-round (median) ratio", round(statistics.median(r[k][0] / r["ort"][0] for r in rows), 3))
