#!/usr/bin/env python3
"""Exports small PyTorch models to ONNX as PyTorch's exporter writes them, with reference outputs, for the
importer's tests (how stages/src/onnx/testdata/ was made; run on a machine with PyTorch).

Each model is written as OUT/<name>.onnx with OUT/<name>.input_<i>.pb and OUT/<name>.output_<i>.pb
(TensorProto), outputs computed by ONNX Runtime when it is installed, else by PyTorch. Weights are random with
a fixed seed; nothing is downloaded.

Usage: python3 export_torch.py OUT           (the small models committed beside this script)
       python3 export_torch.py --full OUT    (full-size ResNet-50, MobileNetV2, BERT-base, GPT-2, opset 17 where
                                              the TorchScript exporter can, else the dynamo one; checked by the
                                              ignored test `external_models_match_stored_outputs`)
"""
import os
import sys

import numpy as np
import torch

FULL = sys.argv[1] == "--full"
OUT = sys.argv[-1]
os.makedirs(OUT, exist_ok=True)
torch.manual_seed(0)


def save_tensor(path, arr):
    import onnx.numpy_helper as nh

    with open(path, "wb") as f:
        f.write(nh.from_array(arr).SerializeToString())


def export(name, model, inputs, opset, names=None, as_kwargs=False, dynamo=False):
    model.eval()
    path = os.path.join(OUT, f"{name}.onnx")
    names = names or [f"x{i}" for i in range(len(inputs))]
    kw = {}
    if "dynamo" in torch.onnx.export.__code__.co_varnames:
        kw["dynamo"] = dynamo
        if dynamo:
            kw["external_data"] = False
    if as_kwargs:
        args, kw["kwargs"] = (), dict(zip(names, inputs))
    else:
        args = tuple(inputs)
    torch.onnx.export(model, args, path, opset_version=opset, input_names=names, do_constant_folding=True, **kw)
    feeds = {n: t.numpy() for n, t in zip(names, inputs)}
    try:
        import onnxruntime as ort

        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        outs = sess.run(None, feeds)
        src = "onnxruntime"
    except ImportError:
        with torch.no_grad():
            o = model(**dict(zip(names, inputs))) if as_kwargs else model(*inputs)
        if hasattr(o, "to_tuple"):
            o = o.to_tuple()
        outs = [t.numpy() for t in (o if isinstance(o, (tuple, list)) else [o])]
        src = "torch"
    for i, a in enumerate(inputs):
        save_tensor(os.path.join(OUT, f"{name}.input_{i}.pb"), a.numpy())
    for i, o in enumerate(outs):
        save_tensor(os.path.join(OUT, f"{name}.output_{i}.pb"), np.asarray(o))
    print(f"{name}: opset {opset}, {os.path.getsize(path)} bytes, outputs from {src}")


class NewGelu(torch.nn.Module):
    """GPT-2's gelu_new, written out as Hugging Face does."""

    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * torch.pow(x, 3.0))))


class Block(torch.nn.Module):
    """A transformer MLP block: LayerNorm, Linear, GELU (erf or tanh), Linear, residual."""

    def __init__(self, d, act):
        super().__init__()
        self.ln = torch.nn.LayerNorm(d)
        self.fc1 = torch.nn.Linear(d, 4 * d)
        self.act = act
        self.fc2 = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.fc2(self.act(self.fc1(self.ln(x))))


class ConvBn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.pool = torch.nn.AdaptiveAvgPool2d(1)
        self.fc = torch.nn.Linear(8, 4)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.uniform_(-0.2, 0.2)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(torch.relu(self.bn(self.conv(x)))), 1))


def full_models():
    """Full-size models with random weights, as the issue's acceptance check uses them."""
    import torchvision
    import transformers

    class LastHidden(torch.nn.Module):
        def __init__(self, m, names):
            super().__init__()
            self.m, self.names = m, names

        def forward(self, *args):
            return self.m(**dict(zip(self.names, args)), use_cache=False, return_dict=True).last_hidden_state

    img = torch.randn(1, 3, 224, 224)
    export("resnet50", torchvision.models.resnet50(), [img], 17)
    export("mobilenet_v2", torchvision.models.mobilenet_v2(), [img], 17)
    ids = torch.randint(0, 30522, (1, 128))
    mask = torch.ones(1, 128, dtype=torch.int64)
    bert = transformers.BertModel(transformers.BertConfig(attn_implementation="eager"))
    export("bert_base", LastHidden(bert, ["input_ids", "attention_mask"]), [ids, mask], 17, names=["input_ids", "attention_mask"])
    gpt2 = transformers.GPT2Model(transformers.GPT2Config(attn_implementation="eager"))
    ids = torch.randint(0, 50257, (1, 128))
    for opset, dynamo in ((17, False), (18, True)):
        try:
            export(f"gpt2_opset{opset}", LastHidden(gpt2, ["input_ids"]), [ids], opset, names=["input_ids"], dynamo=dynamo)
            break
        except Exception as e:
            print(f"gpt2 at opset {opset} (dynamo={dynamo}) failed:", repr(e)[:300])


if FULL:
    full_models()
    sys.exit(0)

x = torch.randn(2, 5, 16)
for opset in (13, 17):
    export(f"mlp_erf_gelu_opset{opset}", Block(16, torch.nn.GELU()), [x], opset)
    export(f"mlp_tanh_gelu_opset{opset}", Block(16, NewGelu()), [x], opset)
export("conv_bn_opset13", ConvBn(), [torch.randn(1, 3, 8, 8)], 13)

def transformer_models():
    import transformers

    print("transformers", transformers.__version__)
    ids = torch.randint(0, 64, (1, 8))
    mask = torch.ones(1, 8, dtype=torch.int64)

    class LastHidden(torch.nn.Module):
        """Calls a Hugging Face model by keyword and returns its last hidden state (a plain tensor output)."""

        def __init__(self, m, names):
            super().__init__()
            self.m, self.names = m, names

        def forward(self, *args):
            return self.m(**dict(zip(self.names, args)), use_cache=False, return_dict=True).last_hidden_state

    def bert():
        cfg = transformers.BertConfig(attn_implementation="eager", vocab_size=64, hidden_size=32, num_hidden_layers=2,
                                      num_attention_heads=2, intermediate_size=64, max_position_embeddings=32)
        m = transformers.BertModel(cfg)
        for opset in (13, 17):
            names = ["input_ids", "attention_mask"]
            export(f"bert_tiny_opset{opset}", LastHidden(m, names), [ids, mask], opset, names=names)

    def gpt2():
        cfg = transformers.GPT2Config(attn_implementation="eager", vocab_size=64, n_positions=32, n_embd=32, n_layer=2,
                                      n_head=2, bos_token_id=0, eos_token_id=0)
        m = transformers.GPT2Model(cfg)
        for opset in (13, 17):
            export(f"gpt2_tiny_opset{opset}", LastHidden(m, ["input_ids"]), [ids], opset, names=["input_ids"])

    for f in (bert, gpt2):
        try:
            f()
        except Exception as e:  # an export failure: say so, keep the rest
            print(f.__name__, "skipped:", repr(e))


try:
    transformer_models()
except ImportError as e:
    print("transformers models skipped:", repr(e))
