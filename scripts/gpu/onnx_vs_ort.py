#!/usr/bin/env python3
"""Checks tessera against ONNX Runtime on ONNX exports of real models made by PyTorch's exporter.

Run where PyTorch, transformers, torchvision and onnxruntime are installed (the GPU machine has them; no
network is needed: every model is built from its config, weights re-initialised by weights.reinit so that every
layer matters in fp32 and fp16 alike). For each model it
  1. exports it with torch.onnx.export at opset 17 (TorchScript exporter; the dynamo exporter as a fallback),
  2. draws inputs with a fixed seed and runs ONNX Runtime (CPU) on them,
  3. runs `tessera run MODEL.onnx --reference` (the reference interpreter) on the same inputs,
  4. compiles the model with `tessera compile` (every CPU backend) and runs the artifact with `tessera run`,
and compares every output with ONNX Runtime's: relative error max|got - want| / max|want| below 1e-4.
  5. for each `--target T` (e.g. `--target cuda --target "cuda -precision=fp16"` on the GPU machine), compiles
     the model for T alone, runs the artifact (on the GPU for cuda) and compares it with the reference
     interpreter's outputs: below 1e-4 for fp32 targets, 1e-2 for fp16 ones; NaN never passes.

Usage: python3 scripts/gpu/onnx_vs_ort.py TESSERA_BINARY WORKDIR REPORT_DIR [--target T]... [--no-cpu-artifact] [model ...]
(--no-cpu-artifact skips step 4, to spend a GPU session's time on the targets alone.)
Writes REPORT_DIR/onnx_vs_ort.json and .md; exits non-zero if any comparison fails.
"""
import json, os, subprocess, sys, time, platform
import numpy as np

from weights import reinit, rel_err

TOL = 1e-4


def _outputs_module():
    import torch

    class Outputs(torch.nn.Module):
        """Returns a Hugging Face model's outputs as a plain tuple (the exporters trace tuples, not ModelOutput)."""

        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, *args):
            return tuple(self.m(*args, return_dict=False))

    return Outputs


def export(name, workdir):
    Outputs = _outputs_module()
    import torch
    torch.manual_seed(0)
    path = os.path.join(workdir, f"{name}.onnx")
    if name in ("resnet50", "mobilenetv2"):
        import torchvision
        model = torchvision.models.resnet50(weights=None) if name == "resnet50" else torchvision.models.mobilenet_v2(weights=None)
        args = (torch.randn(1, 3, 224, 224),)
        in_names, out_names = ["input"], ["logits"]
        dynamic = None
    elif name == "bert-base":
        from transformers import BertConfig, BertModel
        # Eager attention: the TorchScript exporter cannot trace transformers' SDPA path.
        model = Outputs(BertModel(BertConfig(attn_implementation="eager")))
        ids = torch.randint(0, 30522, (1, 128))
        args = (ids, torch.ones(1, 128, dtype=torch.int64))
        in_names, out_names = ["input_ids", "attention_mask"], ["last_hidden_state", "pooler_output"]
        # Symbolic batch and sequence: tessera fixes them with --shape.
        dynamic = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}
    elif name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        model = Outputs(GPT2LMHeadModel(GPT2Config(attn_implementation="eager", use_cache=False)))
        args = (torch.randint(0, 50257, (1, 128)),)
        in_names, out_names = ["input_ids"], ["logits"]
        dynamic = None
    else:
        raise SystemExit(f"unknown model {name}")
    model.eval()
    reinit(model, torch)
    opset, how = 17, "torchscript opset 17"
    with torch.no_grad():
        try:
            torch.onnx.export(model, args, path, opset_version=17, input_names=in_names, output_names=out_names,
                              dynamic_axes=dynamic, dynamo=False)
        except Exception as e:  # the TorchScript exporter may be gone in a future torch
            # The dynamo exporter implements opset 18 and up; asking it for 17 gives a down-converted model that
            # ONNX Runtime rejects (Split with num_outputs), so it exports at 18.
            opset, how = 18, f"dynamo opset 18 (torchscript failed: {type(e).__name__}: {str(e)[:80]})"
            torch.onnx.export(model, args, path, opset_version=18, input_names=in_names, output_names=out_names,
                              dynamic_shapes=None, dynamo=True, external_data=False)
    shapes = {n: list(a.shape) for n, a in zip(in_names, args)}
    return path, how, shapes


def run(cmd):
    t = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}")
    return time.time() - t


def main():
    tessera, workdir, report_dir = sys.argv[1:4]
    rest, targets, names, cpu_artifact = sys.argv[4:], [], [], True
    while rest:
        a = rest.pop(0)
        if a == "--target":
            targets.append(rest.pop(0))
        elif a == "--no-cpu-artifact":
            cpu_artifact = False
        else:
            names.append(a)
    names = names or ["resnet50", "mobilenetv2", "bert-base", "gpt2"]
    os.makedirs(workdir, exist_ok=True)
    os.makedirs(report_dir, exist_ok=True)
    import onnxruntime as ort, torch
    rows, ok = [], True
    for name in names:
        row = {"model": name}
        try:
            path, how, shapes = export(name, workdir)
            row["exporter"] = how
            sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
            rng = np.random.default_rng(1234)
            feeds, input_args, shape_args = {}, [], []
            indir = os.path.join(workdir, f"{name}-inputs")
            os.makedirs(indir, exist_ok=True)
            for inp in sess.get_inputs():
                shape = shapes[inp.name]
                if "int64" in inp.type:
                    vocab = 30522 if "bert" in name else 50257
                    a = rng.integers(0, vocab, size=shape, dtype=np.int64) if inp.name == "input_ids" else np.ones(shape, np.int64)
                else:
                    a = rng.uniform(-1, 1, size=shape).astype(np.float32)
                feeds[inp.name] = a
                f = os.path.join(indir, f"{inp.name}.npy")
                np.save(f, a)
                input_args += ["--input", f"{inp.name}={f}"]
                shape_args += ["--shape", f"{inp.name}={'x'.join(map(str, shape))}"]
            t = time.time()
            want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
            row["ort_s"] = round(time.time() - t, 3)
            # 1. reference interpreter
            ref_out = os.path.join(workdir, f"{name}-ref")
            row["reference_s"] = round(run([tessera, "run", path, "--reference", *input_args, *shape_args, "--out", ref_out]), 3)
            # 2. compiled artifact, every CPU backend
            compared = [("reference", ref_out)]
            if cpu_artifact:
                out_dir = os.path.join(workdir, f"{name}-art")
                comp = [tessera, "compile", path, "--target", "cpu", "--target", "cpu -compiler=gemm",
                        "--store", os.path.join(workdir, "store"), "--out", out_dir, *shape_args]
                row["compile_s"] = round(run(comp), 3)
                run_out = os.path.join(workdir, f"{name}-run")
                row["artifact_run_s"] = round(run([tessera, "run", os.path.join(out_dir, f"{name}.tsr"), *input_args, "--out", run_out]), 3)
                compared.append(("artifact", run_out))
            for kind, d in compared:
                for oname, w in want.items():
                    got = np.load(os.path.join(d, f"{oname}.npy"))
                    err, why = rel_err(got, w)
                    row[f"{kind}:{oname}"] = err
                    if not err < TOL:
                        ok = False
                        row.setdefault("failures", []).append(f"{kind} {oname}: {err:.3e} {why}")
            # 3. each extra target alone, against the reference interpreter
            for ti, target in enumerate(targets):
                tol = 1e-2 if ("precision=fp16" in target or "precision=bf16" in target) else TOL
                t_out = os.path.join(workdir, f"{name}-t{ti}-art")
                secs = run([tessera, "compile", path, "--target", target, "--store", os.path.join(workdir, "store"),
                            "--out", t_out, *shape_args])
                t_run = os.path.join(workdir, f"{name}-t{ti}-run")
                run([tessera, "run", os.path.join(t_out, f"{name}.tsr"), *input_args, "--out", t_run])
                res = row.setdefault("targets", {}).setdefault(target, {"compile_s": round(secs, 3), "tolerance": tol})
                for oname in want:
                    err, why = rel_err(np.load(os.path.join(t_run, f"{oname}.npy")), np.load(os.path.join(ref_out, f"{oname}.npy")))
                    res[oname] = err
                    if not err < tol:
                        ok = False
                        row.setdefault("failures", []).append(f"{target} {oname}: {err:.3e} {why}")
        except Exception as e:
            ok = False
            row["error"] = str(e)[-3000:]
        rows.append(row)
        print(json.dumps(row), flush=True)
    meta = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "host": platform.node(), "cpu": platform.processor(),
            "torch": torch.__version__, "onnxruntime": ort.__version__, "tolerance": TOL, "targets": targets}
    try:
        meta["gpu"] = torch.cuda.get_device_name(0)
    except Exception:
        pass
    with open(os.path.join(report_dir, "onnx_vs_ort.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    with open(os.path.join(report_dir, "onnx_vs_ort.md"), "w") as f:
        f.write(f"# tessera vs ONNX Runtime on PyTorch exports\n\n{json.dumps(meta)}\n\n")
        f.write("| model | exporter | output | reference rel err | artifact rel err | ORT s | reference s | compile s | artifact s |\n|---|---|---|---|---|---|---|---|---|\n")
        for r in rows:
            outs = sorted({k.split(":", 1)[1] for k in r if k.startswith("reference:")})
            for o in outs or ["-"]:
                f.write(f"| {r['model']} | {r.get('exporter','')} | {o} | {r.get('reference:'+o,'')} | {r.get('artifact:'+o,'')} | {r.get('ort_s','')} | {r.get('reference_s','')} | {r.get('compile_s','')} | {r.get('artifact_run_s','')} |\n")
        if targets:
            f.write("\n## Each target alone, artifact against the reference interpreter\n\n"
                    "| model | target | output | rel err | tolerance | compile s |\n|---|---|---|---|---|---|\n")
            for r in rows:
                for target, res in r.get("targets", {}).items():
                    for o, e in res.items():
                        if o not in ("compile_s", "tolerance"):
                            f.write(f"| {r['model']} | `{target}` | {o} | {e:.2e} | {res['tolerance']} | {res['compile_s']} |\n")
        for r in rows:
            if "error" in r or "failures" in r:
                f.write(f"\nFAILED {r['model']}: {r.get('error') or r.get('failures')}\n\n")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
