#!/usr/bin/env python3
"""tessera's CPU artifacts against ONNX Runtime on the same cores, in one run (issue 32).

Run where PyTorch, torchvision, transformers and onnxruntime are installed (no network needed: every model is
built from its config, weights re-initialised by scripts/gpu/weights.py so every layer matters). Per model and
batch size it
  1. exports the model with PyTorch's exporter (TorchScript at opset 17, dynamo at 18 where that fails),
  2. compiles it with `tessera compile` for the default CPU targets with measured costs,
  3. checks the artifact's outputs against ONNX Runtime's on the same random inputs (relative error below 1e-4),
  4. times both on 1, 2, ... threads: each in a process pinned to that many cores (`taskset`), ONNX Runtime
     with intra_op_num_threads set to match, tessera with `tessera bench` (its runtime pool sizes itself from
     the cores it may run on); median of --iters runs after --warmup, inputs random (never zeros),
  5. with --profile, `tessera bench --profile` per artifact: the median of every kernel call, saved beside the
     report, with each step's floor where `--floor-gflops` and `--floor-gbs` are given.

Usage: python3 scripts/cpu_vs_ort.py --tessera BIN --work DIR --report PREFIX
         [--models mobilenetv2,bert4,gpt2-2l] [--batches 1] [--threads 1,2] [--iters 50] [--warmup 10] [--profile]
Writes PREFIX.json and PREFIX.md (and PREFIX-profiles/ with --profile); exits non-zero if a check fails.
"""
import argparse, json, os, platform, subprocess, sys, time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu"))

TOL = 1e-4
MODELS = {
    # name: (kind, description)
    "mobilenetv2": ("vision", "torchvision MobileNetV2, 224x224"),
    "resnet50": ("vision", "torchvision ResNet-50, 224x224"),
    "vit-b16": ("vision", "torchvision ViT-B/16, 224x224"),
    "bert4": ("bert", "BERT, 4 layers, hidden 768, seq 128"),
    "bert-base": ("bert", "BERT-base, 12 layers, seq 128"),
    "gpt2-2l": ("gpt2", "GPT-2, 2 layers, hidden 768, seq 128"),
}
SEQ = 128


def export(name, batch, workdir):
    """Exports `name` at `batch`; returns (path, exporter, {input: (shape, kind)})."""
    import torch
    from weights import reinit
    from onnx_vs_ort import _outputs_module

    Outputs = _outputs_module()  # a Hugging Face model's outputs as a plain tuple, for the exporters
    path = os.path.join(workdir, f"{name}-b{batch}.onnx")
    torch.manual_seed(0)
    kind = MODELS[name][0]
    if kind == "vision":
        import torchvision
        ctor = {"mobilenetv2": torchvision.models.mobilenet_v2, "resnet50": torchvision.models.resnet50,
                "vit-b16": torchvision.models.vit_b_16}[name]
        model = ctor(weights=None)
        args = (torch.randn(batch, 3, 224, 224),)
        inputs = {"input": ([batch, 3, 224, 224], "float")}
        outs = ["logits"]
    elif kind == "bert":
        from transformers import BertConfig, BertModel
        layers = 4 if name == "bert4" else 12
        model = Outputs(BertModel(BertConfig(num_hidden_layers=layers, attn_implementation="eager")))
        args = (torch.randint(0, 30522, (batch, SEQ)), torch.ones(batch, SEQ, dtype=torch.int64))
        inputs = {"input_ids": ([batch, SEQ], "ids:30522"), "attention_mask": ([batch, SEQ], "ones")}
        outs = ["last_hidden_state", "pooler_output"]
    else:
        from transformers import GPT2Config, GPT2LMHeadModel
        model = Outputs(GPT2LMHeadModel(GPT2Config(n_layer=2, attn_implementation="eager", use_cache=False)))
        args = (torch.randint(0, 50257, (batch, SEQ)),)
        inputs = {"input_ids": ([batch, SEQ], "ids:50257")}
        outs = ["logits"]
    if os.path.exists(path):
        return path, "cached", inputs
    model.eval()
    reinit(model, torch)
    how = "torchscript opset 17"
    with torch.no_grad():
        try:
            torch.onnx.export(model, args, path, opset_version=17, input_names=list(inputs), output_names=outs, dynamo=False)
        except Exception as e:
            how = f"dynamo opset 18 (torchscript: {type(e).__name__})"
            torch.onnx.export(model, args, path, opset_version=18, input_names=list(inputs), output_names=outs,
                              dynamo=True, external_data=False)
    return path, how, inputs


def draw(inputs, seed):
    import numpy as np
    rng = np.random.default_rng(seed)
    feeds = {}
    for n, (shape, kind) in inputs.items():
        if kind.startswith("ids:"):
            feeds[n] = rng.integers(0, int(kind[4:]), size=shape, dtype=np.int64)
        elif kind == "ones":
            feeds[n] = np.ones(shape, np.int64)
        else:
            feeds[n] = rng.uniform(-1, 1, size=shape).astype(np.float32)
    return feeds


def pinned(threads):
    return ["taskset", "-c", f"0-{threads - 1}"]


def run(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    return p.stdout


def ort_time_child(path, threads, iters, warmup, inputs_json):
    """In a pinned child: ONNX Runtime's median latency in ms over `iters` runs."""
    import onnxruntime as ort
    inputs = {k: tuple(v) for k, v in json.loads(inputs_json).items()}
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    feeds = draw(inputs, 7)
    for _ in range(warmup):
        sess.run(None, feeds)
    ts = []
    for _ in range(iters):
        t = time.perf_counter()
        sess.run(None, feeds)
        ts.append((time.perf_counter() - t) * 1e3)
    ts.sort()
    print(json.dumps({"median_ms": ts[len(ts) // 2], "min_ms": ts[0]}))


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--ort-child":
        ort_time_child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6])
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--tessera", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--report", required=True)
    ap.add_argument("--models", default="mobilenetv2,bert4,gpt2-2l")
    ap.add_argument("--batches", default="1")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--target", action="append", default=[], help="tessera targets (default: tessera's CPU default)")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--peak-gflops", type=float, default=110.0,
                    help="fp32 FMA rate of one core for the floors (default: the best one-thread sgemm measured on the 2-core machine)")
    a = ap.parse_args()
    import numpy as np
    import onnxruntime as ort
    import torch
    from weights import rel_err
    os.makedirs(a.work, exist_ok=True)
    threads = [int(t) for t in a.threads.split(",")]
    rows, ok = [], True
    profiles_dir = a.report + "-profiles"
    bandwidth = measure_bandwidth() if a.profile else None
    for name in a.models.split(","):
        for batch in [int(b) for b in a.batches.split(",")]:
            row = {"model": name, "batch": batch, "what": MODELS[name][1]}
            try:
                path, how, inputs = export(name, batch, a.work)
                row["exporter"] = how
                # Compile (default CPU targets unless --target), measured costs.
                out_dir = os.path.join(a.work, f"{name}-b{batch}-art")
                t = time.time()
                tflags = [x for tgt in a.target for x in ("--target", tgt)]
                run([a.tessera, "compile", path, *tflags, "--store", os.path.join(a.work, "store"), "--out", out_dir])
                row["compile_s"] = round(time.time() - t, 2)
                art = os.path.join(out_dir, f"{name}-b{batch}.tsr")
                # Correctness on fresh inputs against ORT.
                feeds = draw(inputs, 1234)
                indir = os.path.join(a.work, f"{name}-b{batch}-in")
                os.makedirs(indir, exist_ok=True)
                in_args = []
                for n, v in feeds.items():
                    np.save(os.path.join(indir, f"{n}.npy"), v)
                    in_args += ["--input", f"{n}={os.path.join(indir, n + '.npy')}"]
                sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
                want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
                got_dir = os.path.join(a.work, f"{name}-b{batch}-got")
                run([a.tessera, "run", art, *in_args, "--out", got_dir])
                errs = {}
                for o, w in want.items():
                    e, why = rel_err(np.load(os.path.join(got_dir, f"{o}.npy")), w)
                    errs[o] = e
                    if not e < TOL:
                        ok = False
                        row.setdefault("failures", []).append(f"{o}: {e:.3e} {why}")
                row["rel_err"] = max(errs.values())
                # Timing, each side pinned to the same cores.
                for th in threads:
                    ij = json.dumps({k: list(v) for k, v in inputs.items()})
                    o = run(pinned(th) + [sys.executable, os.path.abspath(__file__), "--ort-child", path, str(th),
                                         str(a.iters), str(a.warmup), ij])
                    ort_ms = json.loads(o.strip().splitlines()[-1])["median_ms"]
                    o = run(pinned(th) + [a.tessera, "bench", art, "--iters", str(a.iters), "--warmup", str(a.warmup), "--json"])
                    tes_ms = json.loads(o)["results"][0]["median_ms"]
                    row[f"t{th}"] = {"tessera_ms": round(tes_ms, 3), "ort_ms": round(ort_ms, 3), "ratio": round(tes_ms / ort_ms, 2)}
                if a.profile:
                    os.makedirs(profiles_dir, exist_ok=True)
                    th = max(threads)
                    ex = json.loads(run([a.tessera, "explain", path, "--store", os.path.join(a.work, "store"), *tflags, "--json"]))
                    o = run(pinned(th) + [a.tessera, "bench", art, "--iters", str(a.iters), "--warmup", str(a.warmup), "--profile", "--json"])
                    steps = json.loads(o)["profiles"][0]
                    prof = profile_rows(ex, steps, th, a.peak_gflops, bandwidth)
                    row["profile"] = {"threads": th, "top": prof[:3], "sum_us": round(sum(p["us"] for p in prof), 1),
                                      "floor_us": round(sum(p["floor_us"] for p in prof), 1)}
                    with open(os.path.join(profiles_dir, f"{name}-b{batch}-t{th}.md"), "w") as f:
                        f.write(profile_md(f"{name} batch {batch}, {th} threads", prof, th, a.peak_gflops, bandwidth))
            except Exception as e:
                ok = False
                row["error"] = str(e)[-3000:]
            rows.append(row)
            print(json.dumps(row), flush=True)
    meta = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "host": platform.node(), "machine": platform.machine(),
            "cpu": cpu_name(), "cores": os.cpu_count(), "torch": torch.__version__, "onnxruntime": ort.__version__,
            "iters": a.iters, "warmup": a.warmup, "targets": a.target or ["(default CPU targets)"]}
    with open(a.report + ".json", "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    with open(a.report + ".md", "w") as f:
        f.write(f"<!-- made by scripts/cpu_vs_ort.py -->\n{json.dumps(meta)}\n\n")
        head = " | ".join(f"{th} thr tessera ms | ORT ms | ratio" for th in threads)
        f.write(f"| model | batch | {head} | rel err vs ORT | compile s |\n|---|---|" + "---|---|---|" * len(threads) + "---|---|\n")
        for r in rows:
            cells = " | ".join(f"{r[f't{th}']['tessera_ms']} | {r[f't{th}']['ort_ms']} | {r[f't{th}']['ratio']}" if f"t{th}" in r else "- | - | -" for th in threads)
            err = f"{r['rel_err']:.2e}" if "rel_err" in r else r.get("error", "")[:60]
            f.write(f"| {r['model']} | {r['batch']} | {cells} | {err} | {r.get('compile_s', '')} |\n")
        profiled = [r for r in rows if "profile" in r]
        if profiled:
            f.write("\n## Where the time goes: the three steps that hold each model back\n\n"
                    f"Per-step medians of `tessera bench --profile` (profiles in {os.path.basename(profiles_dir)}/), "
                    "each against its floor (matrix-product FLOPs at the cores' FMA rate, or its bytes in and out at the "
                    "measured copy bandwidth, whichever is larger).\n\n"
                    "| model | batch | threads | steps us | floor us | step | ops | us | x floor |\n|---|---|---|---|---|---|---|---|---|\n")
            for r in profiled:
                pr = r["profile"]
                for i, t in enumerate(pr["top"]):
                    lead = f"| {r['model']} | {r['batch']} | {pr['threads']} | {pr['sum_us']} | {pr['floor_us']} " if i == 0 else "| | | | | "
                    f.write(lead + f"| {t['step']} ({t['backend']}) | {t['ops']} | {t['us']:.0f} | {t['us'] / max(t['floor_us'], 1e-9):.1f} |\n")
    sys.exit(0 if ok else 1)


def measure_bandwidth():
    """Memory bandwidth in GB/s: the best of five copies of 256 MB (read and write counted), one thread."""
    import numpy as np
    src = np.ones(64 << 20, np.float32)
    dst = np.empty_like(src)
    best = min(_timed(lambda: np.copyto(dst, src)) for _ in range(5))
    return 2 * src.nbytes / best / 1e9


def _timed(f):
    t = time.perf_counter()
    f()
    return time.perf_counter() - t


def profile_rows(ex, steps, threads, peak_gflops, bandwidth):
    """Each step of a host artifact (one per partition, in order) with its partition's work and floor."""
    parts = ex["partitions"]
    if len(parts) != len(steps):
        raise RuntimeError(f"explain lists {len(parts)} partitions but the artifact ran {len(steps)} steps")
    rows = []
    for p, st in zip(parts, steps):
        if p["backend"] != st["backend"]:
            raise RuntimeError(f"partition {p['index']} is {p['backend']} but step {st['step']} is {st['backend']}")
        ops = {}
        for n in p["nodes"]:
            ops[n["op"]] = ops.get(n["op"], 0) + 1
        compute_us = p["gemm_flops"] / (peak_gflops * threads * 1e3)
        memory_us = p["boundary_bytes"] / (bandwidth * 1e3)
        floor = max(compute_us, memory_us)
        rows.append({"step": st["step"], "backend": st["backend"], "first": p["nodes"][0]["name"],
                     "ops": ", ".join(f"{c} {o}" if c > 1 else o for o, c in ops.items()), "us": st["median_us"],
                     "gflop": p["gemm_flops"] / 1e9, "mb": p["boundary_bytes"] / 1e6, "floor_us": floor,
                     "bound": "compute" if compute_us >= memory_us else "memory", "parts": st.get("parts", [])})
    rows.sort(key=lambda r: -r["us"])
    return rows


def profile_md(title, rows, threads, peak_gflops, bandwidth):
    total = sum(r["us"] for r in rows)
    floor = sum(r["floor_us"] for r in rows)
    s = (f"# {title}\n\n{len(rows)} steps, {total:.0f} us (sum of per-step medians), floor {floor:.0f} us "
         f"({total / max(floor, 1e-9):.1f}x): FLOPs of matrix products at {peak_gflops:.0f} GFLOP/s per core x {threads}, "
         f"bytes in and out at {bandwidth:.1f} GB/s (measured copy), whichever is larger.\n\n"
         "| step | backend | ops | first node | us | share | GFLOP | MB | floor us | x floor | bound |\n"
         "|---|---|---|---|---|---|---|---|---|---|---|\n")
    for r in rows:
        s += (f"| {r['step']} | {r['backend']} | {r['ops']} | {r['first']} | {r['us']:.1f} | {100 * r['us'] / total:.1f}% | "
              f"{r['gflop']:.3f} | {r['mb']:.2f} | {r['floor_us']:.1f} | {r['us'] / max(r['floor_us'], 1e-9):.1f} | {r['bound']} |\n")
    # Inside gemm plan functions (a whole network can be one): each GEMM, im2col and depthwise step.
    parts = [(r["step"], p) for r in rows for p in r.get("parts", [])]
    if parts:
        kinds = {}
        for _, p in parts:
            k = kinds.setdefault(p["what"].split()[0], [0, 0.0, 0, 0])
            k[0] += 1
            k[1] += p["median_us"]
            k[2] += p["flops"]
            k[3] += p["bytes"]
        s += ("\n## Inside gemm plan functions\n\nBy kind (count, us, share of all steps, GFLOP/s, GB/s):\n\n"
              "| kind | count | us | share | GFLOP/s | GB/s |\n|---|---|---|---|---|---|\n")
        for k, (n, us, fl, by) in sorted(kinds.items(), key=lambda kv: -kv[1][1]):
            s += f"| {k} | {n} | {us:.0f} | {100 * us / total:.1f}% | {fl / max(us, 1e-9) / 1e3:.1f} | {by / max(us, 1e-9) / 1e3:.1f} |\n"
        s += ("\nEvery step, slowest first (step.index inside the plan function; floor as above):\n\n"
              "| step | what | us | share | MFLOP | MB | GFLOP/s | GB/s | floor us | x floor |\n|---|---|---|---|---|---|---|---|---|---|\n")
        for st, p in sorted(parts, key=lambda sp: -sp[1]["median_us"]):
            us = p["median_us"]
            floor = max(p["flops"] / (peak_gflops * threads * 1e3), p["bytes"] / (bandwidth * 1e3))
            s += (f"| {st}.{p['index']} | {p['what']} | {us:.1f} | {100 * us / total:.1f}% | {p['flops'] / 1e6:.1f} | "
                  f"{p['bytes'] / 1e6:.2f} | {p['flops'] / max(us, 1e-9) / 1e3:.1f} | {p['bytes'] / max(us, 1e-9) / 1e3:.1f} | "
                  f"{floor:.1f} | {us / max(floor, 1e-9):.1f} |\n")
    return s


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    main()
