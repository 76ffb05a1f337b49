#!/usr/bin/env python3
"""tessera against PyTorch on the GPU, in one run: the yardstick table of the GPU issues.

Run on the GPU machine (PyTorch, torchvision, transformers; no network: every model is built from its
config, weights re-initialised from a fixed seed so every layer matters: the libraries' own inits leave
some layers at zero or identity). For each model:
  1. export it to ONNX (TorchScript exporter, opset 17; dynamo opset 18 as a fallback) with those weights;
  2. tessera: `tessera compile` for the target (cold: empty store, fresh process; warm: the same store again,
     fresh process), then `tessera bench --json` (CUDA events around graph replays, inputs on the device);
  3. PyTorch on the same weights and precision: eager, eager captured in one CUDA graph, and
     torch.compile(mode="reduce-overhead") (cold compile time = its first call in a fresh process with empty
     inductor and Triton caches of its own; also its first call in this process), each timed with CUDA events after warm-up, median of ITERS runs on
     random non-zero inputs;
  4. the floor: FLOPs (torch.utils.flop_counter) over the dense matmul rate measured now, and bytes
     (weights + inputs + outputs) over the device copy bandwidth measured now; tessera's distance from it.

TESSERA_TARGETS (default "nvrtc"): the cuda compilers tessera compiles for, e.g. "nvrtc cublas"; several sets
separated by ";" (e.g. "nvrtc cublas cudnn;nvrtc cublas cudnn cutlass") compile and time each set in the same run,
against the same PyTorch measurements (one tessera column per set).
TESSERA_COSTS (default "measured"): `measured` or `analytical` partition costs.
Usage: python3 scripts/gpu/side_by_side.py [--precision P[,P...]] TESSERA_BINARY WORKDIR REPORT.md [model ...]
  P: fp16, bf16 or fp32; several (e.g. --precision fp16,bf16) give one row per model and precision, in one run.
Models: resnet50-b1 resnet50-b32 mobilenetv2-b1 bert-base-s128-b1 bert-base-s128-b8 gpt2-s256-b1 vit-b16-b1
llama-s256-b1 llama-s512-b4 (a Llama-style GQA decoder, hidden 768, 8 layers, 12/4 heads) (and
resnext50-bN, convnext-t-bN, efficientnet-b0-bN for any batch N).
With TESSERA_PROFILE_DIR set, tessera's per-kernel profile (`tessera bench --profile`) of each model is written there.
Precision (default fp16): the same on both sides. fp16 (bf16): PyTorch runs the model in half (bfloat16:
`model.to(dtype)`, float inputs in that type), tessera compiles the fp32 export with `-precision=fp16`
(`bf16`: weights converted once at compile time, fp32 accumulation, fp32 inputs and outputs); the floor uses
that type's matmul rate and weight bytes. fp32: TF32 off on both sides.
"""
import json, os, subprocess, sys, time, math, tempfile, datetime

from weights import reinit

ITERS = 50
WARMUP = 10
TARGET = "cuda -compiler=nvrtc"
# TESSERA_COSTS (default "measured"): where partition costs come from; measured costs time every candidate on
# this GPU during the cold compile (the tune stage), so the cold compile time includes tuning.
COSTS = os.environ.get("TESSERA_COSTS", "measured")
# TESSERA_TARGETS="nvrtc cublas" compiles for several cuda compilers at once (the search places each partition).
# Words starting with "-" are attributes every target of the set gets: "nvrtc cublas cudnn -layout=nhwc"; attributes
# after a compiler and ":" are its target's alone: "nvrtc:-fast-compile=mid cublas cudnn".
COMPILER_SETS = [s.split() for s in os.environ.get("TESSERA_TARGETS", "nvrtc").split(";") if s.strip()]
COMPILERS = COMPILER_SETS[0]
PRECISION = "fp16"
PRECISIONS = ("fp16", "bf16", "fp32")

os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="inductor-cold-"))


def build(name, torch):
    """The model (eval mode, plain tuple outputs) and example inputs on the CPU."""
    class Outputs(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, *args):
            out = self.m(*args, return_dict=False)
            return tuple(o for o in out if o is not None)

    batch = int(name.rsplit("-b", 1)[1])
    vision = {"resnet50": "resnet50", "mobilenetv2": "mobilenet_v2", "vit-b16": "vit_b_16", "resnext50": "resnext50_32x4d", "convnext-t": "convnext_tiny", "efficientnet-b0": "efficientnet_b0"}
    if name.rsplit("-b", 1)[0] in vision:
        import torchvision
        ctor = {k: getattr(torchvision.models, v) for k, v in vision.items()}
        model = ctor[name.rsplit("-b", 1)[0]](weights=None)
        args = (torch.rand(batch, 3, 224, 224) * 2 - 1,)
        names = ["input"]
    elif name.startswith("bert-base"):
        from transformers import BertConfig, BertModel
        seq = int(name.split("-s")[1].split("-")[0])
        model = Outputs(BertModel(BertConfig(attn_implementation="eager")))
        args = (torch.randint(0, 30522, (batch, seq)), torch.ones(batch, seq, dtype=torch.int64))
        names = ["input_ids", "attention_mask"]
    elif name.startswith("gpt2"):
        from transformers import GPT2Config, GPT2LMHeadModel
        seq = int(name.split("-s")[1].split("-")[0])
        model = Outputs(GPT2LMHeadModel(GPT2Config(attn_implementation="eager", use_cache=False)))
        args = (torch.randint(0, 50257, (batch, seq)),)
        names = ["input_ids"]
    elif name.startswith("llama"):
        # A Llama-style decoder: hidden 768, 8 layers, grouped-query attention (12 query heads over 4 key/value
        # heads), the default (SDPA) attention, causal LM logits.
        from transformers import LlamaConfig, LlamaForCausalLM
        seq = int(name.split("-s")[1].split("-")[0])
        cfg = LlamaConfig(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=8, num_attention_heads=12,
                          num_key_value_heads=4, max_position_embeddings=2048, use_cache=False)
        model = Outputs(LlamaForCausalLM(cfg))
        args = (torch.randint(0, 32000, (batch, seq)),)
        names = ["input_ids"]
    else:
        raise SystemExit(f"unknown model {name}")
    reinit(model, torch)
    return model.eval(), args, names


def export(model, args, names, path, torch):
    with torch.no_grad():
        try:
            torch.onnx.export(model, args, path, opset_version=17, input_names=names, dynamo=False)
            return "torchscript opset 17"
        except Exception as e:
            torch.onnx.export(model, args, path, opset_version=18, input_names=names, dynamo=True, external_data=False)
            return f"dynamo opset 18 (torchscript: {type(e).__name__})"


# NVRTC (CUDA 12.9 and later) keeps what it compiled in the driver's compute cache (~/.nv/ComputeCache) where
# a driver is present, and a later compile of the same source in any process takes it from there: found on
# an H200 on 2026-11-27, where ResNet-50 b1's whole-plan module compiled in 8.4 s the first time and 0.5 s
# in every later process with an empty store. A cold compile is timed with that cache off, as on a machine
# that never built the model; the warm rebuild keeps it, as a user's would.
COLD_ENV = dict(os.environ, CUDA_CACHE_DISABLE="1")


def timed(cmd, env=None):
    t = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        lines = (p.stderr or p.stdout).strip().splitlines()
        # The first error line names the model and the cause; the last only counts failures.
        errors = [l for l in lines if l.startswith("error")] or lines[-1:]
        raise RuntimeError(f"{' '.join(cmd[:3])} failed: {errors[0][:400]}")
    return time.time() - t, p.stdout


def cuda_median_ms(fn, torch, iters=ITERS, warmup=WARMUP):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    times.sort()
    return times[len(times) // 2]


def dtype(torch):
    return {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[PRECISION]


def rates(torch):
    """Dense matmul rate in the run's precision (FLOP/s) and device copy bandwidth (bytes/s, read + write),
    measured now."""
    a = torch.randn(8192, 8192, device="cuda", dtype=dtype(torch))
    b = torch.randn(8192, 8192, device="cuda", dtype=dtype(torch))
    ms = cuda_median_ms(lambda: a @ b, torch, iters=10, warmup=3)
    flops = 2 * 8192 ** 3 / (ms / 1e3)
    x = torch.randn(256 * 1024 * 1024 // 4, device="cuda")
    y = torch.empty_like(x)
    ms = cuda_median_ms(lambda: y.copy_(x), torch, iters=20, warmup=3)
    bw = 2 * x.numel() * 4 / (ms / 1e3)
    del a, b, x, y
    torch.cuda.empty_cache()
    return flops, bw


def torch_side(model, args, torch, row):
    from torch.utils.flop_counter import FlopCounterMode
    dev = [a.cuda().to(dtype(torch)) if a.is_floating_point() else a.cuda() for a in args]
    m = model.cuda().to(dtype(torch))
    with torch.inference_mode():
        # The FLOP count is for the floor only: PyTorch's counter rejects grouped-query SDPA (an assertion on
        # the q/k/v shapes), and then the row keeps its timings without a floor.
        try:
            with FlopCounterMode(display=False) as fc:
                out = m(*dev)
            row["flops"] = fc.get_total_flops()
        except Exception as e:
            row["flops_error"] = f"{type(e).__name__}: {str(e)[:120]}"
            out = m(*dev)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        row["io_bytes"] = sum(a.numel() * a.element_size() for a in dev) + sum(o.numel() * o.element_size() for o in outs)
        row["weight_bytes"] = sum(p.numel() * p.element_size() for p in m.parameters())
        row["eager_ms"] = cuda_median_ms(lambda: m(*dev), torch)
        try:
            static = [a.clone() for a in dev]
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    m(*static)
            torch.cuda.current_stream().wait_stream(s)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                m(*static)
            row["cuda_graph_ms"] = cuda_median_ms(graph.replay, torch)
        except Exception as e:
            row["cuda_graph_error"] = f"{type(e).__name__}: {str(e)[:120]}"
    try:
        torch._dynamo.reset()
        c = torch.compile(m, mode="reduce-overhead")
        with torch.inference_mode():
            t = time.time()
            c(*dev)
            torch.cuda.synchronize()
            row["torch_compile_s"] = time.time() - t
            row["torch_compile_ms"] = cuda_median_ms(lambda: c(*dev), torch)
    except Exception as e:
        row["torch_compile_error"] = f"{type(e).__name__}: {str(e)[:160]}"
    m.cpu()
    torch.cuda.empty_cache()


def torch_compile_cold(name, row):
    """torch.compile's truly cold compile of `name`: its first call in a fresh process, with an inductor and a
    Triton cache of its own (empty), so that nothing another model compiled is reused. TORCH_COLD=0 skips it."""
    if os.environ.get("TORCH_COLD", "1") == "0":
        return
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=tempfile.mkdtemp(prefix="inductor-fresh-"), TRITON_CACHE_DIR=tempfile.mkdtemp(prefix="triton-fresh-"))
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--torch-compile-cold", name, PRECISION], capture_output=True, text=True, env=env)
    last = (p.stdout.strip().splitlines() or [""])[-1]
    if p.returncode == 0 and last.startswith("{"):
        row.update(json.loads(last))
    else:
        row["torch_compile_cold_error"] = ((p.stderr or p.stdout).strip().splitlines() or ["no output"])[-1][:200]


def torch_compile_cold_child(name):
    """The child of torch_compile_cold: prints {"torch_compile_cold_s": seconds} as its last line."""
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model, args, _ = build(name, torch)
    dev = [a.cuda().to(dtype(torch)) if a.is_floating_point() else a.cuda() for a in args]
    m = model.cuda().to(dtype(torch))
    c = torch.compile(m, mode="reduce-overhead")
    with torch.inference_mode():
        torch.cuda.synchronize()
        t = time.time()
        c(*dev)
        torch.cuda.synchronize()
        print(json.dumps({"torch_compile_cold_s": time.time() - t}))


def tessera_side(tessera, path, shapes, workdir, name, row, index=0, compilers=None):
    """Compiles and times the model for one set of compilers; set 0's figures under the plain keys, set i's
    with the suffix `_i` as well."""
    compilers = compilers or COMPILERS
    store = os.path.join(workdir, f"store-{name}-{index}")
    out = os.path.join(workdir, f"out-{name}-{index}")
    shape_args = sum((["--shape", f"{k}={'x'.join(map(str, v))}"] for k, v in shapes.items()), [])
    cmd = [tessera, "compile", path] + [a for t in targets(compilers) for a in ("--target", t)] + ["--store", store, "--out", out, "--costs", COSTS] + shape_args
    cold, cold_json = timed(cmd + ["--json"], env=COLD_ENV)
    warm, _ = timed(cmd)
    try:
        # Where the cold compile's time went: each stage's summed execution time (parallel work adds up).
        stages = json.loads(cold_json)["stages"]
        row["tessera_cold_stages" + ("" if index == 0 else f"_{index}")] = {k: round(v["exec_micros"] / 1e6, 2) for k, v in stages.items()}
    except (ValueError, KeyError):
        pass
    artifacts = [os.path.join(out, f) for f in os.listdir(out) if f.endswith(".tsr")]
    _, js = timed([tessera, "bench", artifacts[0], "--json", "--iters", str(ITERS * 4), "--warmup", str(WARMUP)])
    r = json.loads(js)["results"][0]
    for suffix in ([""] if index == 0 else []) + [f"_{index}"]:
        row["tessera_cold_s" + suffix], row["tessera_warm_s" + suffix] = cold, warm
        row["tessera_ms" + suffix] = r["median_ms"]
        row["tessera_kernels" + suffix] = r.get("kernels")
    name = name if index == 0 else f"{name}-set{index}"
    # Where the time goes: each kernel timed on its own (TESSERA_PROFILE_DIR set), kept beside the report.
    prof_dir = os.environ.get("TESSERA_PROFILE_DIR")
    if prof_dir:
        os.makedirs(prof_dir, exist_ok=True)
        _, text = timed([tessera, "bench", artifacts[0], "--profile", "--iters", "50", "--warmup", "5"])
        with open(os.path.join(prof_dir, f"{name}.txt"), "w") as f:
            f.write(text)


def targets(compilers=None):
    words = compilers or COMPILERS
    attrs = "".join(f" {w}" for w in words if w.startswith("-"))
    # "nvrtc:-fast-compile=mid": attributes of that compiler's target alone.
    return [f"cuda -compiler={c.split(':')[0]}" + (f" -precision={PRECISION}" if PRECISION != "fp32" else "") + attrs + "".join(f" {a}" for a in c.split(":")[1:]) for c in words if not c.startswith("-")]


def target(compilers=None):
    return " + ".join(targets(compilers))


def fmt(v, unit=""):
    if v is None:
        return "-"
    return f"{v:.3g}{unit}" if isinstance(v, float) else str(v)


def main():
    global PRECISION
    argv = sys.argv[1:]
    if argv[:1] == ["--torch-compile-cold"]:
        PRECISION = argv[2]
        return torch_compile_cold_child(argv[1])
    precisions = ["fp16"]
    if argv and argv[0].startswith("--precision"):
        value = argv[0].split("=", 1)[1] if "=" in argv[0] else argv[1]
        argv = argv[1:] if "=" in argv[0] else argv[2:]
        precisions = value.split(",")
    for p in precisions:
        assert p in PRECISIONS, f"--precision {p}: one of {', '.join(PRECISIONS)}"
    tessera, workdir, report = argv[:3]
    names = argv[3:] or ["resnet50-b1", "resnet50-b32", "mobilenetv2-b1", "bert-base-s128-b1", "bert-base-s128-b8", "gpt2-s256-b1", "vit-b16-b1"]
    os.makedirs(workdir, exist_ok=True)
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    rows = []
    measured = {}
    for PRECISION in precisions:
        flops_rate, bandwidth = rates(torch)
        measured[PRECISION] = (flops_rate, bandwidth)
        for name in names:
            row = {"model": name, "precision": PRECISION}
            # Work files per precision (one export, store and artifact each).
            tag = name if len(precisions) == 1 else f"{name}-{PRECISION}"
            print(f"== {name} ({PRECISION})", flush=True)
            try:
                model, args, in_names = build(name, torch)
                path = os.path.join(workdir, f"{tag}.onnx")
                row["exporter"] = export(model, args, in_names, path, torch)
                for i, compilers in enumerate(COMPILER_SETS):
                    try:
                        tessera_side(tessera, path, {n: list(a.shape) for n, a in zip(in_names, args)}, workdir, tag, row, i, compilers)
                    except Exception as e:
                        row[f"tessera_error_{i}"] = str(e)[:200]
                torch_side(model, args, torch, row)
                torch_compile_cold(name, row)
            except Exception as e:
                row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            if "flops" in row:
                row["floor_ms"] = max(row["flops"] / flops_rate, (row["weight_bytes"] + row["io_bytes"]) / bandwidth) * 1e3
            print(json.dumps(row), flush=True)
            rows.append(row)
    # The text below names one precision where the run had one, else each row's.
    PRECISION = precisions[0] if len(precisions) == 1 else "/".join(precisions)
    flops_rate, bandwidth = measured[precisions[0]]

    def ratio(a, b):
        return a / b if a and b else None

    lines = [
        "# tessera against PyTorch on the GPU",
        "",
        f"{datetime.date.today()}, {torch.cuda.get_device_name()}, driver CUDA {torch.version.cuda}, PyTorch {torch.__version__}; "
        f"generated by scripts/gpu/side_by_side.py. {PRECISION} on both sides, TF32 off"
        + (" (PyTorch: the model cast to the row's type; tessera: the fp32 export compiled with -precision=fp16 or bf16, fp32 accumulation). " if PRECISION != "fp32" else ". ")
        + f"tessera: target `{' + '.join(f'cuda -compiler={c}' for c in COMPILERS if not c.startswith('-'))}{''.join(' ' + w for w in COMPILERS if w.startswith('-'))}` (with the row's -precision), {COSTS} costs, CUDA events around graph replays. PyTorch: CUDA events, median of "
        f"{ITERS} after {WARMUP} warm-up runs. Measured now: "
        + ", ".join(f"{p} matmul {measured[p][0] / 1e12:.1f} TFLOP/s" for p in precisions)
        + f", copy {bandwidth / 1e9:.0f} GB/s. "
        "torch.compile cold: its first call in a fresh process with empty inductor and Triton caches of its own (the figure in "
        "parentheses: its first call in this process, whose inductor cache later models share with earlier ones). "
        "tessera compile: `tessera compile` in a fresh process, cold = empty store.",
        "",
        "| model | precision | tessera ms | eager ms | eager+graph ms | torch.compile ms | compile/tessera | tessera kernels | tessera compile cold / warm s | torch.compile cold s | floor ms | tessera / floor |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    logs = []
    for r in rows:
        t = r.get("tessera_ms")
        lines.append(
            f"| {r['model']} | {r['precision']} | {fmt(t)} | {fmt(r.get('eager_ms'))} | {fmt(r.get('cuda_graph_ms'))} | {fmt(r.get('torch_compile_ms'))} | "
            f"{fmt(ratio(r.get('torch_compile_ms'), t))} | {fmt(r.get('tessera_kernels'))} | {fmt(r.get('tessera_cold_s'))} / {fmt(r.get('tessera_warm_s'))} | "
            f"{fmt(r.get('torch_compile_cold_s'))} ({fmt(r.get('torch_compile_s'))}) | {fmt(r.get('floor_ms'))} | {fmt(ratio(t, r.get('floor_ms')))} |"
        )
        for k in ["error", "torch_compile_error", "torch_compile_cold_error", "cuda_graph_error"] + [f"tessera_error_{i}" for i in range(len(COMPILER_SETS))]:
            if k in r:
                logs.append(f"- {r['model']}: {k}: {r[k]}")
    if len(COMPILER_SETS) > 1:
        lines += ["", "Each target set, in the same run (torch.compile / tessera per set; cold / warm compile s):", "",
                  "| model | precision | " + " | ".join(f"`{' + '.join(c)}` ms | ratio | cold / warm s" for c in COMPILER_SETS) + " |",
                  "|---|---|" + "---|---|---|" * len(COMPILER_SETS)]
        for r in rows:
            cells = []
            for i in range(len(COMPILER_SETS)):
                t = r.get(f"tessera_ms_{i}")
                cells += [fmt(t), fmt(ratio(r.get("torch_compile_ms"), t)), f"{fmt(r.get(f'tessera_cold_s_{i}'))} / {fmt(r.get(f'tessera_warm_s_{i}'))}"]
            lines.append(f"| {r['model']} | {r['precision']} | " + " | ".join(cells) + " |")
        for i in range(len(COMPILER_SETS)):
            for p in precisions:
                g = [ratio(r.get("torch_compile_ms"), r.get(f"tessera_ms_{i}")) for r in rows if r["precision"] == p]
                g = [x for x in g if x]
                if g:
                    lines.append(f"\nSet {i} (`{' + '.join(COMPILER_SETS[i])}`), {p}: geometric mean of torch.compile / tessera over {len(g)} models: {math.exp(sum(map(math.log, g)) / len(g)):.3f}.")
    for p in precisions:
        both = [ratio(r.get("torch_compile_ms"), r.get("tessera_ms")) for r in rows if r["precision"] == p]
        both = [b for b in both if b]
        if both:
            lines += ["", f"{p}: geometric mean of torch.compile / tessera over {len(both)} models: {math.exp(sum(map(math.log, both)) / len(both)):.3f} (above 1: tessera faster)."]
    if logs:
        lines += ["", "Errors:"] + logs
    with open(report, "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.splitext(report)[0] + ".json", "w") as f:
        json.dump({"rows": rows, "matmul_flops": {p: m[0] for p, m in measured.items()}, "copy_bytes_per_s": bandwidth}, f, indent=1)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
