#!/usr/bin/env python3
"""The corpus of exported transformers (fixtures/corpus/): small configs of the transformer architectures users
bring, each exported the ways users export them, with its inputs and ONNX Runtime's outputs, so that CI plans and
checks real exports without torch.

Run where PyTorch (CPU is enough), torchvision, transformers, onnx, onnxscript and onnxruntime are installed; no
network: every model is built from a small config with random weights, every parameter re-initialised as
scripts/gpu/beyond_zoo.py does, so the output depends on every layer. Hugging Face models take their default
attention implementation (what a user who calls `from_pretrained` gets: SDPA in current transformers), and a
few also the eager one (older transformers, and models without SDPA). For each model and each exporter:
  - TorchScript (`torch.onnx.export(dynamo=False)`, opset 17) and dynamo (`dynamo=True`, opset 18);
  - writes OUT/<model>-<exporter>/model.onnx, inputs/<input>.npy and expected/<output>.npy (ONNX Runtime's
    outputs on those inputs, CPU provider), and checks ONNX Runtime against PyTorch (relative error below 1e-4);
  - records in OUT/manifest.json how it went (or why the exporter refused), the node count, the ops, and the
    number of attention layers the model has (`attention_layers`: what a front end must fuse).
Sizes are kept small (hidden 64, two layers, vocabulary 256) so the whole corpus fits in the repository;
every pattern the full-size model exports is kept.

Usage: python3 scripts/export_corpus.py OUT [--only NAME ...]
"""
import argparse, json, os, sys, zlib

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu"))
from beyond_zoo import _wrapper, onnx_summary, reinit  # noqa: E402
from weights import rel_err  # noqa: E402

EXPORTERS = [("torchscript", 17, False), ("dynamo", 18, True)]
TOL = 1e-4
SEQ = 16
VOCAB = 256
ENC = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
           max_position_embeddings=32)
# GQA decoders: 4 query heads over 2 key/value heads, head dim 32 (wider than hidden / heads, as Qwen3 and
# Gemma have it).
DEC = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=2, head_dim=32, max_position_embeddings=32, use_cache=False)


def hf(model_cls, config_cls, attn=None, encoder_of=False, **cfg):
    def build():
        import transformers
        config = getattr(transformers, config_cls)(**cfg)
        kw = {"attn_implementation": attn} if attn else {}
        m = getattr(transformers, model_cls)._from_config(config, **kw)
        return m.get_encoder() if encoder_of else m
    return build


def vit():
    from torchvision.models.vision_transformer import VisionTransformer
    return VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=64, mlp_dim=128,
                             num_classes=10)


def swin():
    from torchvision.models.swin_transformer import SwinTransformer
    # swin_t's blocks (shifted windows with their mask, relative position bias), two stages, 4x4 windows.
    return SwinTransformer(patch_size=[4, 4], embed_dim=32, depths=[2, 2], num_heads=[2, 4], window_size=[4, 4],
                           num_classes=10)


# name -> (builder, input kind, attention layers). kind: "text" (input_ids, attention_mask with the last 3
# positions padded) -> last hidden state; "causal" (input_ids, attention_mask of ones) -> logits; "audio"
# (features) -> last hidden state; "image" (1x3x32x32, Swin 1x3x64x64) -> logits.
CORPUS = {
    "bert": (hf("BertModel", "BertConfig", **ENC), "text", 2),
    "bert_eager": (hf("BertModel", "BertConfig", attn="eager", **ENC), "text", 2),
    "roberta": (hf("RobertaModel", "RobertaConfig", **ENC), "text", 2),
    "distilbert": (hf("DistilBertModel", "DistilBertConfig", vocab_size=VOCAB, dim=64, n_layers=2, n_heads=2,
                      hidden_dim=128, max_position_embeddings=32), "text", 2),
    "gpt2": (hf("GPT2LMHeadModel", "GPT2Config", vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=2, n_positions=32,
                bos_token_id=0, eos_token_id=0, use_cache=False), "causal", 2),
    "gpt2_eager": (hf("GPT2LMHeadModel", "GPT2Config", attn="eager", vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=2,
                      n_positions=32, bos_token_id=0, eos_token_id=0, use_cache=False), "causal", 2),
    "vit": (vit, "image", 2),
    "swin": (swin, "image", 4),
    "t5_encoder": (hf("T5EncoderModel", "T5Config", vocab_size=VOCAB, d_model=64, d_kv=32, d_ff=128, num_layers=2,
                      num_heads=2), "text", 2),
    "llama": (hf("LlamaForCausalLM", "LlamaConfig", **DEC), "causal", 2),
    "llama_eager": (hf("LlamaForCausalLM", "LlamaConfig", attn="eager", **DEC), "causal", 2),
    "qwen2": (hf("Qwen2ForCausalLM", "Qwen2Config", **DEC), "causal", 2),
    "whisper_encoder": (hf("WhisperModel", "WhisperConfig", encoder_of=True, vocab_size=VOCAB, d_model=64,
                           encoder_layers=2, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
                           encoder_ffn_dim=128, decoder_ffn_dim=128, num_mel_bins=16, max_source_positions=16,
                           max_target_positions=16, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                           decoder_start_token_id=1), "audio", 2),
}


def build(name):
    """(torch module returning a tuple, inputs as numpy arrays by name, attention layers)."""
    import torch
    seed = zlib.crc32(name.encode())
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    builder, kind, layers = CORPUS[name]
    model = builder()
    if kind == "image":
        side = 64 if name == "swin" else 32
        inputs = {"image": rng.standard_normal((1, 3, side, side)).astype(np.float32)}
    elif kind == "audio":
        cfg = model.config
        inputs = {"input_features": rng.standard_normal((1, cfg.num_mel_bins, 2 * cfg.max_source_positions)).astype(np.float32)}
    else:
        mask = np.ones((1, SEQ), np.int64)
        if kind == "text":
            mask[:, -3:] = 0
        inputs = {"input_ids": rng.integers(0, VOCAB, size=(1, SEQ), dtype=np.int64), "attention_mask": mask}
    reinit(model, seed)
    return _wrapper()(model, kind).eval(), inputs, layers


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
    import onnx
    import onnxruntime as ort
    import torch
    import transformers
    os.makedirs(a.out, exist_ok=True)
    manifest = {"torch": torch.__version__, "onnxruntime": ort.__version__, "onnx": onnx.__version__,
                "transformers": transformers.__version__, "models": []}
    for arch in a.only or CORPUS:
        model, inputs, layers = build(arch)
        with torch.no_grad():
            want = model(*(torch.from_numpy(x) for x in inputs.values()))[0].numpy()
        for exporter, opset, dynamo in EXPORTERS:
            name = f"{arch}-{exporter}"
            row = {"name": name, "arch": arch, "exporter": exporter, "opset": opset, "attention_layers": layers}
            d = os.path.join(a.out, name)
            os.makedirs(os.path.join(d, "inputs"), exist_ok=True)
            os.makedirs(os.path.join(d, "expected"), exist_ok=True)
            path = os.path.join(d, "model.onnx")
            try:
                export(model, inputs, opset, dynamo, path)
                sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
                feed = {i.name: inputs[i.name] for i in sess.get_inputs()}
                outs = sess.run(None, feed)
                for k, v in feed.items():
                    np.save(os.path.join(d, "inputs", f"{k}.npy"), v)
                for o, v in zip(sess.get_outputs(), outs):
                    np.save(os.path.join(d, "expected", f"{o.name}.npy"), v)
                err, why = rel_err(outs[0], want)
                nodes, ops = onnx_summary(path)
                row.update(status="ok" if err < TOL and not why else "mismatch", ort_vs_torch=err, nodes=nodes,
                           ops=ops, inputs={k: list(v.shape) for k, v in feed.items()}, bytes=os.path.getsize(path))
            except Exception as e:  # an exporter that refuses the model is a finding, not a crash
                row.update(status="export failed", error=f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}")
                import shutil
                shutil.rmtree(d, ignore_errors=True)
            print(json.dumps({k: v for k, v in row.items() if k != "ops"}), flush=True)
            manifest["models"].append(row)
    with open(os.path.join(a.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2, sort_keys=True)
    write_zoo(a.out, [r["name"] for r in manifest["models"] if r["status"] == "ok"])


def write_zoo(out, names):
    """OUT/corpus.toml: a zoo manifest of the exports, so `tessera compile fixtures/corpus/corpus.toml` builds them all."""
    with open(os.path.join(out, "corpus.toml"), "w") as f:
        f.write("# The corpus of real exports (scripts/export_corpus.py writes it): one entry per export.\n")
        for n in names:
            f.write(f'\n[[entry]]\nonnx = "{n}/model.onnx"\nname = "{n}"\n')


if __name__ == "__main__":
    main()
