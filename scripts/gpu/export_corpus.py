#!/usr/bin/env python3
"""The corpus of exported transformers (issue 57): small configs of the transformer architectures users bring,
each exported both ways users export them, with its inputs and ONNX Runtime's outputs, so that CI can plan and
check real exports without torch.

Run where PyTorch, transformers, onnx and onnxruntime are installed (the GPU machine has them; no network: every
model is built from a small config with random weights, as scripts/gpu/beyond_zoo.py builds it, every parameter
re-initialised so the output depends on every layer). For each architecture and each exporter:
  - TorchScript (`torch.onnx.export(dynamo=False)`, opset 17) and dynamo (`dynamo=True`, opset 18);
  - writes OUT/<arch>-<exporter>/model.onnx, inputs/<input>.npy and expected/<output>.npy (ONNX Runtime's
    outputs on those inputs, CPU provider), and checks ONNX Runtime against PyTorch (relative error below 1e-4);
  - records in OUT/manifest.json how it went (or why the exporter refused), the node count, the ops, and the
    attention-shaped ops (Softmax count: one per attention layer when nothing else uses one).

Usage: python3 scripts/gpu/export_corpus.py OUT [--only NAME ...]
"""
import argparse, json, os, sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from beyond_zoo import build, onnx_summary  # noqa: E402
from weights import rel_err  # noqa: E402

# BERT, RoBERTa, DistilBERT, GPT-2, ViT, Swin, T5's encoder, Llama- and Qwen2-style GQA decoders, Whisper's encoder.
CORPUS = ["bert", "roberta", "distilbert", "gpt2", "vit_small", "swin_small", "t5_encoder", "llama", "qwen2",
          "whisper_encoder"]
EXPORTERS = [("torchscript", 17, False), ("dynamo", 18, True)]
TOL = 1e-4


def export(model, inputs, opset, dynamo, path):
    import torch
    args = tuple(torch.from_numpy(a) for a in inputs.values())
    kw = dict(opset_version=opset, input_names=list(inputs), output_names=["out0"], dynamo=dynamo)
    if dynamo:
        kw["external_data"] = False
    with torch.no_grad():
        torch.onnx.export(model, args, path, **kw)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--only", nargs="*")
    a = ap.parse_args()
    import onnxruntime as ort
    import torch
    os.makedirs(a.out, exist_ok=True)
    manifest = {"torch": torch.__version__, "onnxruntime": ort.__version__, "models": []}
    try:
        import transformers
        manifest["transformers"] = transformers.__version__
    except ImportError:
        pass
    for arch in a.only or CORPUS:
        model, inputs, _ = build(arch)
        with torch.no_grad():
            want = model(*(torch.from_numpy(x) for x in inputs.values()))[0].numpy()
        for exporter, opset, dynamo in EXPORTERS:
            name = f"{arch}-{exporter}"
            row = {"name": name, "arch": arch, "exporter": exporter, "opset": opset}
            d = os.path.join(a.out, name)
            os.makedirs(os.path.join(d, "inputs"), exist_ok=True)
            os.makedirs(os.path.join(d, "expected"), exist_ok=True)
            path = os.path.join(d, "model.onnx")
            try:
                export(model, inputs, opset, dynamo, path)
                sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
                feed = {i.name: inputs[i.name] for i in sess.get_inputs()}
                outs = sess.run(None, feed)
                for i, (k, v) in enumerate(inputs.items()):
                    np.save(os.path.join(d, "inputs", f"{k}.npy"), v)
                for o, v in zip(sess.get_outputs(), outs):
                    np.save(os.path.join(d, "expected", f"{o.name}.npy"), v)
                err, why = rel_err(outs[0], want)
                nodes, ops = onnx_summary(path)
                import onnx
                m = onnx.load(path, load_external_data=False)
                row.update(status="ok" if err < TOL and not why else "mismatch", ort_vs_torch=err, nodes=nodes,
                           ops=ops, softmax=sum(n.op_type == "Softmax" for n in m.graph.node),
                           inputs={k: list(v.shape) for k, v in inputs.items()}, bytes=os.path.getsize(path))
            except Exception as e:  # an exporter that refuses the model is a finding, not a crash
                row.update(status="export failed", error=f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}")
                for f in ("model.onnx",):
                    if os.path.exists(os.path.join(d, f)):
                        os.remove(os.path.join(d, f))
            print(json.dumps(row), flush=True)
            manifest["models"].append(row)
    with open(os.path.join(a.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2, sort_keys=True)


if __name__ == "__main__":
    main()
