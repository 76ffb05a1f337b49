"""Per-node times of ONNX Runtime on one model: where ORT spends its time, to set against `tessera bench --profile`.

usage: python ort_node_profile.py MODEL.onnx THREADS RUNS
Runs the model RUNS times after 20 warm-up runs with ORT's profiler on (intra-op threads THREADS, all graph
optimizations), and prints each node's median kernel time in execution order, with its op and output shape.
"""
import json, os, statistics, sys, tempfile
from collections import defaultdict
import numpy as np
import onnxruntime as ort

path, threads, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
so = ort.SessionOptions()
so.intra_op_num_threads = threads
so.inter_op_num_threads = 1
so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
so.enable_profiling = True
so.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "ort")
sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
rng = np.random.default_rng(0)
feeds = {}
for i in sess.get_inputs():
    shape = [d if isinstance(d, int) else 1 for d in i.shape]
    if "int" in i.type:
        feeds[i.name] = rng.integers(0, 100, shape).astype(np.int64)
    else:
        feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
for _ in range(20):
    sess.run(None, feeds)
for _ in range(runs):
    sess.run(None, feeds)
trace = json.load(open(sess.end_profiling()))
times, meta, order = defaultdict(list), {}, []
for e in trace:
    if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
        continue
    name = e["name"][: -len("_kernel_time")]
    if name not in meta:
        order.append(name)
        a = e.get("args", {})
        meta[name] = (a.get("op_name", "?"), a.get("output_type_shape", ""))
    times[name].append(e["dur"])
total = 0.0
per_op = defaultdict(float)
for n in order:
    t = times[n][20:]  # the warm-up runs are traced too
    med = statistics.median(t) if t else statistics.median(times[n])
    total += med
    op, shape = meta[n]
    per_op[op] += med
    shp = ",".join("x".join(str(d) for d in list(s.values())[0]) for s in shape) if shape else ""
    print(f"{med:9.1f} us  {op:22s} {shp:28s} {n}")
print(f"{total:9.1f} us  total (sum of node medians)")
for op, t in sorted(per_op.items(), key=lambda x: -x[1]):
    print(f"{t:9.1f} us  {op}")
