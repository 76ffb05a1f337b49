#!/usr/bin/env python3
"""Beyond the zoo: architectures tessera never bundled, exported from PyTorch and checked end to end.

Run where PyTorch, torchvision and transformers are installed (the GPU machine has them; no network is
needed: every model is built from code or a small config, with random weights). For each architecture it
  1. builds the model with a fixed seed and re-initialises EVERY parameter so the output depends on every
     layer: weights ~ N(0, 1/fan_in) (convolutions N(0, 2/fan_in)), biases ~ U(-0.1, 0.1), 1-D scales
     1 + N(0, 0.1); BatchNorm statistics are measured on random batches. The libraries' own inits zero some
     heads and biases, and then a classifier's output is its bias alone and a comparison tests nothing;
  2. exports it to ONNX: TorchScript at opset 17, or the dynamo exporter at opset 18 where the model needs it
     (current transformers' GPT-2 and Llama: TorchScript stops at aten::diff) or where TorchScript fails;
  3. runs PyTorch (fp32, CPU) on inputs drawn with a fixed seed, and once more on redrawn inputs: an output
     that barely moves (relative change below 1e-2) fails, since comparing it would test little;
  4. runs `tessera run MODEL.onnx --reference` and compares it with PyTorch;
  5. for each target, `tessera compile` (one shared --store, so identical kernels are compiled once) and
     `tessera run ARTIFACT.tsr`, compared with the reference interpreter, and with PyTorch fp32;
  6. for targets with a reduced precision (fp16, bf16), PyTorch's own error in that precision: the model cast
     to it (`model.to(dtype)`, on the GPU where there is one) against PyTorch fp32, so a tessera row's error
     reads next to what the precision costs PyTorch on the same model and inputs.
Relative error is max|got - want| / max|want|; it must be below 1e-4 (1e-2 for targets with
`precision=fp16` or `precision=bf16`); NaN never passes.

Usage: python3 scripts/gpu/beyond_zoo.py TESSERA WORKDIR REPORT_DIR [--targets T ...] [--only NAME ...]
                                          [--costs measured|analytical]
  e.g. on the GPU machine: --targets "cuda" "cuda -precision=fp16" "cuda -precision=bf16"; the default
  target `cpu` runs anywhere. A target set is one argument, its targets joined by " + "
  ("cuda -precision=fp16 + cuda -compiler=cudnn -precision=fp16").
Writes REPORT_DIR/beyond_zoo.json and beyond_zoo.md (one row per model x target); exits non-zero on any
failure.
"""
import argparse, json, os, platform, subprocess, sys, time, zlib

import numpy as np

from weights import rel_err

TOL_FP32 = 1e-4
# fp16 storage (fp32 accumulation).
TOL_FP16 = 1e-2
# bf16: fp16's budget in units of the type's roundoff (8 bits of mantissa against 11: eight times as coarse);
# see BF16_TOLERANCE in tests/gpu.rs for why 1e-2 cannot hold in bf16.
TOL_BF16 = 8e-2
# The first output must move by at least this much (relative) when the input is redrawn.
MIN_SENSITIVITY = 1e-2
IMAGE = (1, 3, 64, 64)
# Models whose blocks need a larger image: MaxViT partitions each stage into 7x7 windows and grids, so its
# four stages need 224 (56, 28, 14 and 7 pixels a side).
IMAGE_OF = {"maxvit_t": (1, 3, 224, 224)}
SEQ = 16
VOCAB = 1000


# ---------------------------------------------------------------------------------------------- models

def _tv(name, **kw):
    def build():
        import torchvision
        return getattr(torchvision.models, name)(weights=None, **kw)
    return build


def _vit():
    from torchvision.models.vision_transformer import VisionTransformer
    return VisionTransformer(image_size=64, patch_size=16, num_layers=2, num_heads=4, hidden_dim=128, mlp_dim=256,
                             num_classes=10)


def _swin():
    from torchvision.models.swin_transformer import SwinTransformer
    # swin_t's blocks (shifted windows, relative position bias, attention masks), two stages, small windows.
    return SwinTransformer(patch_size=[4, 4], embed_dim=48, depths=[2, 2], num_heads=[3, 6], window_size=[4, 4],
                           num_classes=10)


# name -> (builder, input kind). Image models take one 1x3x64x64 image.
TORCHVISION = {
    "resnext50_32x4d": _tv("resnext50_32x4d"),
    "mobilenet_v3_small": _tv("mobilenet_v3_small"),
    "efficientnet_b0": _tv("efficientnet_b0"),
    "densenet121": _tv("densenet121"),
    "squeezenet1_1": _tv("squeezenet1_1"),
    "shufflenet_v2_x0_5": _tv("shufflenet_v2_x0_5"),
    "regnet_y_400mf": _tv("regnet_y_400mf"),
    "mnasnet0_5": _tv("mnasnet0_5"),
    "googlenet": _tv("googlenet", aux_logits=False, init_weights=True),
    "convnext_tiny": _tv("convnext_tiny"),
    "maxvit_t": _tv("maxvit_t"),
    "vit_small": _vit,
    "swin_small": _swin,
}

# Small Hugging Face configs: 2 layers, hidden 128, 4 heads, FFN 256, vocabulary 1000.
_ENC = dict(vocab_size=VOCAB, hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256,
            max_position_embeddings=64)


def _hf(model_cls, config_cls, **cfg):
    def build():
        import transformers
        config = getattr(transformers, config_cls)(**cfg)
        return getattr(transformers, model_cls)._from_config(config, attn_implementation="eager")
    return build


def _hf_encoder_of(model_cls, config_cls, **cfg):
    """The encoder half of an encoder-decoder model."""
    inner = _hf(model_cls, config_cls, **cfg)
    return lambda: inner().get_encoder()


# name -> (builder, kind, prefer dynamo). kind: "text" (input_ids, attention_mask with the last 3 positions
# padded) -> last hidden state; "causal" (input_ids, attention_mask of ones) -> logits; "audio" (features).
HF = {
    "bert": (_hf("BertModel", "BertConfig", **_ENC), "text", False),
    "distilbert": (_hf("DistilBertModel", "DistilBertConfig", vocab_size=VOCAB, dim=128, n_layers=2, n_heads=4,
                       hidden_dim=256, max_position_embeddings=64), "text", False),
    "roberta": (_hf("RobertaModel", "RobertaConfig", **_ENC), "text", False),
    "albert": (_hf("AlbertModel", "AlbertConfig", embedding_size=64, **_ENC), "text", False),
    "electra": (_hf("ElectraModel", "ElectraConfig", embedding_size=64, **_ENC), "text", False),
    "deberta_v2": (_hf("DebertaV2Model", "DebertaV2Config", relative_attention=True, position_buckets=32,
                       pos_att_type=["p2c", "c2p"], **_ENC), "text", False),
    "t5_encoder": (_hf("T5EncoderModel", "T5Config", vocab_size=VOCAB, d_model=128, d_kv=32, d_ff=256,
                       num_layers=2, num_heads=4), "text", False),
    "bart_encoder": (_hf_encoder_of("BartModel", "BartConfig", vocab_size=VOCAB, d_model=128, encoder_layers=2,
                                    decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4,
                                    encoder_ffn_dim=256, decoder_ffn_dim=256, max_position_embeddings=64),
                     "text", False),
    "whisper_encoder": (_hf_encoder_of("WhisperModel", "WhisperConfig", vocab_size=VOCAB, d_model=128,
                                       encoder_layers=2, decoder_layers=1, encoder_attention_heads=4,
                                       decoder_attention_heads=4, encoder_ffn_dim=256, decoder_ffn_dim=256,
                                       num_mel_bins=16, max_source_positions=16, max_target_positions=16, pad_token_id=0,
                                       bos_token_id=1, eos_token_id=2, decoder_start_token_id=1),
                        "audio", False),
    "gpt2": (_hf("GPT2LMHeadModel", "GPT2Config", vocab_size=VOCAB, n_embd=128, n_layer=2, n_head=4,
                 n_positions=64, bos_token_id=0, eos_token_id=0, use_cache=False), "causal", True),
    "gpt_neo": (_hf("GPTNeoForCausalLM", "GPTNeoConfig", vocab_size=VOCAB, hidden_size=128, num_layers=2,
                    num_heads=4, attention_types=[[["global", "local"], 1]], window_size=8,
                    max_position_embeddings=64, use_cache=False), "causal", False),
    "opt": (_hf("OPTForCausalLM", "OPTConfig", vocab_size=VOCAB, hidden_size=128, num_hidden_layers=2,
                num_attention_heads=4, ffn_dim=256, word_embed_proj_dim=128, max_position_embeddings=64,
                use_cache=False), "causal", False),
    "llama": (_hf("LlamaForCausalLM", "LlamaConfig", vocab_size=VOCAB, hidden_size=128, intermediate_size=256,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                  use_cache=False), "causal", True),
    "mistral": (_hf("MistralForCausalLM", "MistralConfig", vocab_size=VOCAB, hidden_size=128,
                    intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                    max_position_embeddings=64, sliding_window=None, use_cache=False), "causal", True),
    "qwen2": (_hf("Qwen2ForCausalLM", "Qwen2Config", vocab_size=VOCAB, hidden_size=128, intermediate_size=256,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                  use_cache=False), "causal", True),
}

MODELS = list(TORCHVISION) + list(HF)


def reinit(model, seed, calibration=None):
    """Every parameter drawn afresh, so the output depends on every layer: weights N(0, 1/fan_in) (convolutions
    N(0, 2/fan_in), as they feed ReLU-like activations), biases U(-0.1, 0.1), other 1-D parameters (norm scales)
    1 + N(0, 0.1). BatchNorm statistics are then measured on `calibration` batches (a callable returning random
    inputs): with statistics that do not match the activations, eval-mode BatchNorm shrinks deep CNNs' signals
    until the logits are the classifier bias alone."""
    import torch
    g = torch.Generator().manual_seed(seed)
    convs = {name for name, m in model.named_modules() if isinstance(m, torch.nn.modules.conv._ConvNd)}
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            if name.endswith("bias") or name.endswith(".b"):
                p.copy_(torch.rand(p.shape, generator=g) * 0.2 - 0.1)
            elif p.dim() <= 1:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                fan_in = int(np.prod(p.shape[1:]))
                gain = 2.0 if name.rsplit(".", 1)[0] in convs else 1.0
                p.copy_(torch.randn(p.shape, generator=g) * np.sqrt(gain / fan_in))
        norms = [m for _, m in sorted(model.named_modules(), key=lambda kv: kv[0])
                 if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
        if norms and calibration is not None:
            for m in norms:
                m.reset_running_stats()
                m.momentum = None  # a cumulative average over the calibration batches
            model.train()
            for _ in range(4):
                model(calibration())
    model.eval()


def _wrapper():
    import torch

    class Outputs(torch.nn.Module):
        """A model's outputs as a plain tuple of tensors (exporters trace tuples, not ModelOutput)."""

        def __init__(self, m, kind):
            super().__init__()
            self.m, self.kind = m, kind

        def forward(self, *args):
            if self.kind == "image":
                return (self.m(*args),)
            if self.kind == "audio":
                return (self.m(input_features=args[0], return_dict=True).last_hidden_state,)
            out = self.m(input_ids=args[0], attention_mask=args[1], return_dict=True)
            if self.kind == "causal":
                return (out.logits,)
            return (out.last_hidden_state,)

    return Outputs


def build(name):
    """(torch module returning a tuple, inputs as numpy arrays by name, prefer dynamo)."""
    import torch
    seed = zlib.crc32(name.encode())
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    if name in TORCHVISION:
        model, kind, dynamo = TORCHVISION[name](), "image", False
        inputs = {"image": rng.standard_normal(IMAGE_OF.get(name, IMAGE)).astype(np.float32)}
    else:
        builder, kind, dynamo = HF[name]
        model = builder()
        if kind == "audio":
            cfg = model.config
            inputs = {"input_features": rng.standard_normal((1, cfg.num_mel_bins, 2 * cfg.max_source_positions)).astype(np.float32)}
        else:
            mask = np.ones((1, SEQ), np.int64)
            if kind == "text":
                mask[:, -3:] = 0
            inputs = {"input_ids": rng.integers(0, VOCAB, size=(1, SEQ), dtype=np.int64), "attention_mask": mask}
    calibration = None
    if kind == "image":
        import torch
        cal = torch.Generator().manual_seed(seed + 1)
        calibration = lambda: torch.randn((8,) + IMAGE_OF.get(name, IMAGE)[1:], generator=cal)
    reinit(model, seed, calibration)
    return _wrapper()(model, kind).eval(), inputs, dynamo


def export(name, model, inputs, dynamo, path):
    """Exports to `path`; returns how."""
    import torch
    args = tuple(torch.from_numpy(a) for a in inputs.values())
    names = list(inputs)
    with torch.no_grad():
        if not dynamo:
            try:
                torch.onnx.export(model, args, path, opset_version=17, input_names=names, output_names=["out0"],
                                  dynamo=False)
                return "torchscript opset 17"
            except Exception as e:
                why = f" (torchscript failed: {type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''})"
        else:
            why = ""
        torch.onnx.export(model, args, path, opset_version=18, input_names=names, output_names=["out0"],
                          dynamo=True, external_data=False)
        return "dynamo opset 18" + why


def sensitivity(model, inputs, out0):
    """Relative change of the first output when the float inputs or token ids are redrawn: a degenerate init
    (a head at zero, so the output is a bias alone) shows as ~0."""
    import torch
    rng = np.random.default_rng(7)
    other = {}
    for name, a in inputs.items():
        if a.dtype == np.float32:
            other[name] = rng.standard_normal(a.shape).astype(np.float32)
        elif name == "input_ids":
            other[name] = rng.integers(0, VOCAB, size=a.shape, dtype=a.dtype)
        else:
            other[name] = a
    with torch.no_grad():
        out = model(*(torch.from_numpy(a) for a in other.values()))[0].numpy()
    return float(np.abs(out - out0).max() / max(np.abs(out0).max(), np.finfo(np.float64).tiny))


def onnx_summary(path):
    import onnx
    m = onnx.load(path, load_external_data=False)
    ops = sorted({n.op_type for n in m.graph.node})
    return len(m.graph.node), ops


# ---------------------------------------------------------------------------------------------- checks

def run(cmd):
    t = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        tail = (p.stderr.strip() or p.stdout.strip())[-1500:]
        raise RuntimeError(f"`{' '.join(cmd[1:3])}` exited {p.returncode}: {tail}")
    return time.time() - t


def compare(outputs, want, out_dir):
    """Largest relative error over the outputs and the reason when one is not finite."""
    worst, why = 0.0, ""
    for oname in outputs:
        err, w = rel_err(np.load(os.path.join(out_dir, f"{oname}.npy")), want[oname])
        if err > worst or (w and not why):
            worst, why = max(worst, err), w or why
    return worst, why


def precision(target):
    """The `-precision` a target string asks for (fp32 when it names none)."""
    for word in target.split():
        if word.startswith("-precision="):
            return word.split("=", 1)[1]
    return "fp32"


def tolerance(target):
    return {"fp32": TOL_FP32, "bf16": TOL_BF16}.get(precision(target), TOL_FP16)


def torch_in_precision(model, inputs, name, want):
    """PyTorch's own error in precision `name` (fp16 or bf16): a copy of the model cast to it, float inputs
    cast too (token ids stay integers), on the GPU where there is one (CPU fp16 kernels are missing for some
    ops), against `want` (PyTorch fp32's first output)."""
    import copy, torch
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[name]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    m = copy.deepcopy(model).to(device=device, dtype=dtype)
    args = [torch.from_numpy(a).to(device) for a in inputs.values()]
    args = [a.to(dtype) if a.is_floating_point() else a for a in args]
    with torch.no_grad():
        got = m(*args)[0].float().cpu().numpy()
    return rel_err(got, want)


def slug(target):
    return "".join(c if c.isalnum() else "_" for c in target).strip("_")


def check_model(name, args, tessera, store):
    """Rows (one per target) for one architecture."""
    import torch
    work = os.path.join(args.workdir, name)
    os.makedirs(work, exist_ok=True)
    base = {"model": name}
    try:
        model, inputs, dynamo = build(name)
        path = os.path.join(work, f"{name}.onnx")
        t = time.time()
        base["exporter"] = export(name, model, inputs, dynamo, path)
        base["export_s"] = round(time.time() - t, 2)
        base["onnx_nodes"], base["onnx_ops"] = onnx_summary(path)
        base["params"] = int(sum(p.numel() for p in model.parameters()))
        input_args = []
        for iname, a in inputs.items():
            f = os.path.join(work, f"input-{iname}.npy")
            np.save(f, a)
            input_args += ["--input", f"{iname}={f}"]
        with torch.no_grad():
            outs = model(*(torch.from_numpy(a) for a in inputs.values()))
        torch_out = {f"out{i}": o.detach().numpy().astype(np.float32) for i, o in enumerate(outs)}
        base["input_sensitivity"] = sensitivity(model, inputs, torch_out["out0"])
        base["output_shape"] = list(torch_out["out0"].shape)
        ref_dir = os.path.join(work, "ref")
        base["reference_s"] = round(run([tessera, "run", path, "--reference", *input_args, "--out", ref_dir]), 2)
        err, why = compare(torch_out, torch_out, ref_dir)
        base["ref_vs_torch"] = err
        base["ref_ok"] = err < TOL_FP32 and base["input_sensitivity"] >= MIN_SENSITIVITY
        if not err < TOL_FP32:
            base["ref_error"] = f"reference vs PyTorch {err:.3e} {why}".strip()
        elif not base["input_sensitivity"] >= MIN_SENSITIVITY:
            base["ref_error"] = (f"the output barely depends on the input (relative change {base['input_sensitivity']:.1e} "
                                 f"for another input): the comparison would test little")
        ref = {o: np.load(os.path.join(ref_dir, f"{o}.npy")) for o in torch_out}
        # PyTorch's own error in each reduced precision a target asks for, once per model.
        torch_reduced = {}
        for p in sorted({precision(t) for t in args.targets} - {"fp32"}):
            try:
                err, why = torch_in_precision(model, inputs, p, torch_out["out0"])
                torch_reduced[p] = (err, why)
            except Exception as e:
                torch_reduced[p] = (None, f"{type(e).__name__}: {e}"[:300])
    except Exception as e:
        base["ref_ok"] = False
        base["ref_error"] = f"{type(e).__name__}: {e}"[-1500:]
        return [dict(base, target=t, ok=False, error=base["ref_error"]) for t in args.targets]
    rows = []
    for target in args.targets:
        row = dict(base, target=target, tolerance=tolerance(target), precision=precision(target))
        if row["precision"] != "fp32":
            row["torch_precision_vs_torch"], why = torch_reduced[row["precision"]]
            if why:
                row["torch_precision_note"] = why
        try:
            art_dir = os.path.join(work, f"art-{slug(target)}")
            # A target set is written "T1 + T2 + ...": one --target each.
            target_args = [a for t in target.split(" + ") for a in ("--target", t.strip())]
            row["compile_s"] = round(run([tessera, "compile", path, "--store", store, "--costs", args.costs,
                                          *target_args, "--out", art_dir]), 2)
            run_dir = os.path.join(work, f"run-{slug(target)}")
            row["artifact_run_s"] = round(run([tessera, "run", os.path.join(art_dir, f"{name}.tsr"), *input_args,
                                               "--out", run_dir]), 2)
            err, why = compare(ref, ref, run_dir)
            row["artifact_vs_ref"] = err
            row["artifact_vs_torch"], _ = compare(torch_out, torch_out, run_dir)
            row["ok"] = base["ref_ok"] and err < row["tolerance"]
            problems = [base["ref_error"]] if not base["ref_ok"] else []
            if not err < row["tolerance"]:
                problems.append(f"artifact vs reference {err:.3e} {why}".strip())
            if problems:
                row["error"] = "; ".join(problems)
        except Exception as e:
            row["ok"] = False
            row["error"] = "; ".join(filter(None, [base.get("ref_error"), f"{type(e).__name__}: {e}"[-1500:]]))
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------- report

def fmt(x):
    return "" if x is None else (f"{x:.2e}" if isinstance(x, float) else str(x))


def write_report(report_dir, meta, rows):
    os.makedirs(report_dir, exist_ok=True)
    with open(os.path.join(report_dir, "beyond_zoo.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    passed = sum(r["ok"] for r in rows)
    with open(os.path.join(report_dir, "beyond_zoo.md"), "w") as f:
        f.write("# Beyond the zoo: PyTorch exports of architectures tessera never bundled\n\n")
        f.write(f"Made by `scripts/gpu/beyond_zoo.py` on {meta['date']}, host `{meta['host']}` "
                f"({meta['cpu']}{', ' + meta['gpu'] if meta.get('gpu') else ''}); torch {meta['torch']}, "
                f"torchvision {meta['torchvision']}, transformers {meta['transformers']}, onnx {meta['onnx']}. "
                f"Every parameter re-initialised (weights N(0, 1/fan_in), convolutions N(0, 2/fan_in), biases "
                f"U(-0.1, 0.1), 1-D scales 1 + N(0, 0.1), BatchNorm statistics measured on 4 random batches of 8); images {'x'.join(map(str, IMAGE))} (MaxViT-T {'x'.join(map(str, IMAGE_OF['maxvit_t']))}), text 1x{SEQ}. "
                f"Relative error max|got - want| / max|want|: reference interpreter vs PyTorch fp32 (tolerance "
                f"{TOL_FP32:g}), artifact vs reference (tolerance {TOL_FP32:g}, {TOL_FP16:g} for precision=fp16, {TOL_BF16:g} for bf16); "
                f"artifact vs torch: the artifact against PyTorch fp32; torch in precision: PyTorch's own model cast to "
                f"the target's precision (fp16, bf16; on the GPU) against PyTorch fp32, the error that precision costs "
                f"PyTorch (not a pass criterion); "
                f"partition costs {meta['costs']}. Input sensitivity: the relative change of the output when the input is "
                f"redrawn (at least {MIN_SENSITIVITY:g}, so the output is not a bias alone). "
                f"**{passed} of {len(rows)} rows pass.**\n\n")
        f.write("| model | target | exporter | ONNX nodes | input sensitivity | ref vs torch | artifact vs ref | artifact vs torch | torch in precision vs torch | compile s | result |\n")
        f.write("|---|---|---|---|---|---|---|---|---|---|---|\n")
        for r in rows:
            exporter = r.get("exporter", "").split(" (")[0]
            f.write(f"| {r['model']} | `{r['target']}` | {exporter} | {fmt(r.get('onnx_nodes'))} | "
                    f"{fmt(r.get('input_sensitivity'))} | {fmt(r.get('ref_vs_torch'))} | {fmt(r.get('artifact_vs_ref'))} | "
                    f"{fmt(r.get('artifact_vs_torch'))} | {fmt(r.get('torch_precision_vs_torch'))} | {fmt(r.get('compile_s'))} | "
                    f"{'pass' if r['ok'] else 'FAIL'} |\n")
        failures = [r for r in rows if not r["ok"]]
        if failures:
            f.write("\n## Failures\n\n")
            for r in failures:
                f.write(f"- **{r['model']}** (`{r['target']}`): {r.get('error', '').replace(chr(10), ' ')}\n")
        notes = [r for r in rows if "(" in r.get("exporter", "")]
        if notes:
            f.write("\n## Exporter notes\n\n")
            for r in {r["model"]: r for r in notes}.values():
                f.write(f"- {r['model']}: {r['exporter']}\n")
        f.write("\n## ONNX op types per model\n\n")
        for r in {r["model"]: r for r in rows if r.get("onnx_ops")}.values():
            f.write(f"- {r['model']} ({r.get('params', 0) / 1e6:.2f} M parameters): {' '.join(r['onnx_ops'])}\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tessera")
    ap.add_argument("workdir")
    ap.add_argument("report_dir")
    ap.add_argument("--targets", nargs="+", default=["cpu"])
    ap.add_argument("--only", nargs="+", default=None, choices=MODELS, metavar="NAME")
    ap.add_argument("--costs", default="analytical", choices=["measured", "analytical"],
                    help="partition costs (analytical: no measurement, the same plan everywhere; the checks do not "
                         "depend on it)")
    args = ap.parse_args()
    import torch, torchvision, transformers, onnx
    tessera = os.path.abspath(args.tessera)
    os.makedirs(args.workdir, exist_ok=True)
    store = os.path.join(args.workdir, "store")
    gpu = ""
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True).stdout.strip().splitlines()[0]
    except Exception:
        pass
    meta = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "host": platform.node(),
            "cpu": platform.processor() or platform.machine(), "gpu": gpu, "torch": torch.__version__,
            "torchvision": torchvision.__version__, "transformers": transformers.__version__,
            "onnx": onnx.__version__, "targets": args.targets, "costs": args.costs,
            "tolerance_fp32": TOL_FP32, "tolerance_fp16": TOL_FP16, "tolerance_bf16": TOL_BF16}
    rows = []
    for name in args.only or MODELS:
        t = time.time()
        new = check_model(name, args, tessera, store)
        rows += new
        for r in new:
            status = "pass" if r["ok"] else "FAIL " + r.get("error", "")[:300]
            print(f"{name:20s} {r['target']:24s} ref {fmt(r.get('ref_vs_torch')):9s} art "
                  f"{fmt(r.get('artifact_vs_ref')):9s} vs torch {fmt(r.get('artifact_vs_torch')):9s} torch-"
                  f"{r.get('precision', 'fp32')} {fmt(r.get('torch_precision_vs_torch')):9s} {time.time() - t:6.1f}s {status}",
                  flush=True)
        write_report(args.report_dir, meta, rows)
    sys.exit(0 if rows and all(r["ok"] for r in rows) else 1)


if __name__ == "__main__":
    main()
