import json, subprocess, sys, time, statistics
import numpy as np, onnxruntime as ort
model, batch, rounds, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
bins = sys.argv[5:]
so = ort.SessionOptions(); so.intra_op_num_threads = 2; so.inter_op_num_threads = 1
so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
sess = ort.InferenceSession(f"/tmp/ortw/{model}-b{batch}.onnx", so, providers=["CPUExecutionProvider"])
rng = np.random.default_rng(7)
# Every input from the model's own signature: images uniform in [-1, 1), token ids in [0, 100).
feeds = {i.name: (rng.integers(0, 100, size=i.shape) if "int" in i.type else rng.uniform(-1, 1, size=i.shape).astype(np.float32)) for i in sess.get_inputs()}
def ort_ms():
    for _ in range(5): sess.run(None, feeds)
    ts = []
    for _ in range(n):
        t = time.perf_counter(); sess.run(None, feeds); ts.append((time.perf_counter() - t) * 1e3)
    return (statistics.median(ts), min(ts))
def tsr_ms(b, art):
    out = subprocess.run([b, "bench", "--iters", str(n), "--warmup", "5", "--threads", "2", "--json", art], capture_output=True, text=True, check=True).stdout
    j = json.loads(out); return (j["results"][0]["median_ms"], j["results"][0]["min_ms"])
rows = []
for r in range(rounds):
    row = {"ort": ort_ms()}
    order = list(range(len(bins))) if r % 2 == 0 else list(reversed(range(len(bins))))
    for i in order:
        b, art = bins[i].split("=")
        row[f"t{i}"] = tsr_ms(b, art)
    rows.append(row)
    print(json.dumps({k: [round(v[0], 3), round(v[1], 3)] for k, v in row.items()}), flush=True)
for k in rows[0]:
    print(k, "median of medians", round(statistics.median(r[k][0] for r in rows), 3), "min of mins", round(min(r[k][1] for r in rows), 3),
          "ratio min", round(min(r[k][1] for r in rows) / min(r["ort"][1] for r in rows), 3), "median per-round ratio", round(statistics.median(r[k][0] / r["ort"][0] for r in rows), 3))
