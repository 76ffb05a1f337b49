#!/usr/bin/env python3
"""fp16 that says when it cannot hold (issue 31), end to end on the GPU: a small convolutional model whose
activations reach ~2e5 (beyond fp16's 65504) between two layers is compiled with `-precision=fp16` for each
target set, run on the GPU and compared with the reference interpreter on the same inputs. The default
policy (`-overflow=keep-fp32`) and `-overflow=bf16` (the kept nodes in bf16) must give a finite result within
fp16's tolerance, as must `-precision=bf16` (fp32's range: nothing kept); `-overflow=error` must refuse to
build, naming a node.

Usage: python3 scripts/gpu/overflow_check.py TESSERA WORKDIR REPORT.md
Exits non-zero on any failure. Needs numpy and onnx.
"""
import json, os, subprocess, sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

TOL_FP16 = 1e-2
# Each GPU set with each of its precisions' settings.
GPU_SETS = [["nvrtc"], ["nvrtc", "cublas", "cudnn"], ["nvrtc", "cutlass"]]
SETTINGS = ["-precision=fp16", "-precision=fp16 -overflow=bf16", "-precision=bf16"]
TARGET_SETS = [[f"cuda -compiler={c} {s}" for c in compilers] for s in SETTINGS for compilers in GPU_SETS]


def model(path):
    """x (1x8x16x16) -> Conv 3x3 (weights 0.5: sums ~1e1) -> Mul 2e4 (~2e5) -> Relu -> Conv 1x1 (weights 1e-5/16)
    -> Add bias -> Flatten -> MatMul (2048x10) -> y. Only the middle stretch leaves fp16's range."""
    rng = np.random.default_rng(7)
    w1 = (0.5 * rng.standard_normal((16, 8, 3, 3))).astype(np.float32)
    up = np.full((1, 16, 1, 1), 2e4, np.float32)
    w2 = (1e-4 * rng.standard_normal((8, 16, 1, 1))).astype(np.float32)
    b2 = (0.1 * rng.standard_normal((8,))).astype(np.float32)
    w3 = (rng.standard_normal((8 * 16 * 16, 10)) / 40).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Mul", ["c1", "up"], ["big"], name="scale_up"),
        helper.make_node("Relu", ["big"], ["r"], name="relu"),
        helper.make_node("Conv", ["r", "w2", "b2"], ["c2"], name="conv2"),
        helper.make_node("Flatten", ["c2"], ["f"], name="flatten"),
        helper.make_node("MatMul", ["f", "w3"], ["y"], name="head"),
    ]
    inits = [numpy_helper.from_array(a, n) for a, n in [(w1, "w1"), (up, "up"), (w2, "w2"), (b2, "b2"), (w3, "w3")]]
    g = helper.make_graph(nodes, "overflow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(m, path)


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def outputs(dir):
    return {f[:-4]: np.load(os.path.join(dir, f)) for f in sorted(os.listdir(dir)) if f.endswith(".npy") and not f.startswith("input")}


def rel_err(got, want):
    if not np.all(np.isfinite(got)):
        return float("inf")
    return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))


def main():
    tessera, work, report = sys.argv[1], sys.argv[2], sys.argv[3]
    os.makedirs(work, exist_ok=True)
    m = os.path.join(work, "overflow.onnx")
    model(m)
    rc, out, err = run([tessera, "run", m, "--reference", "--seed", "1", "--out", os.path.join(work, "ref")])
    assert rc == 0, err
    want = np.load(os.path.join(work, "ref", "y.npy"))
    rows, ok = [], True
    for i, targets in enumerate(TARGET_SETS):
        targs = [a for t in targets for a in ("--target", t)]
        out_dir = os.path.join(work, f"out{i}")
        rc, out, err = run([tessera, "compile", m, *targs, "--store", os.path.join(work, "store"), "--out", out_dir, "--costs", "measured", "--json", "-q"])
        if rc != 0:
            rows.append((targets, "compile failed: " + err.strip()[-300:], None, False))
            ok = False
            continue
        parts = json.loads(out)["artifacts"][0]["partitions_by_backend"]
        rc, _, err = run([tessera, "explain", m, *targs, "--store", os.path.join(work, "store"), "--costs", "measured", "--json"])
        kept = [f"{k['name']} ({k.get('dtype', 'f32')})" for p in json.loads(_)["partitions"] for k in p.get("kept_fp32", [])] if rc == 0 else [f"explain failed: {err[-200:]}"]
        got_dir = os.path.join(work, f"got{i}")
        rc, _, err = run([tessera, "run", os.path.join(out_dir, "overflow.tsr"), "--seed", "1", "--out", got_dir])
        if rc != 0:
            rows.append((targets, "run failed: " + err.strip()[-300:], None, False))
            ok = False
            continue
        e = rel_err(np.load(os.path.join(got_dir, "y.npy")), want)
        good = e < TOL_FP16
        ok &= good
        rows.append((targets, f"partitions {parts}; kept out of fp16: {', '.join(kept) or 'none'}", e, good))
    # -overflow=error refuses, naming a node.
    rc, _, err = run([tessera, "compile", m, "--target", "cuda -precision=fp16 -overflow=error", "--store", os.path.join(work, "store"), "--out", os.path.join(work, "err"), "--costs", "analytical"])
    refused = rc != 0 and "scale_up" in err
    ok &= refused
    with open(report, "w") as f:
        f.write("# fp16 overflow policy (and bf16) on the GPU\n\n")
        gpu = run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"])[1].strip()
        f.write(f"`scripts/gpu/overflow_check.py`, {gpu}. A model whose activations reach ~2e5 between two convolutions, compiled with `-precision=fp16` (default `-overflow=keep-fp32`, and `-overflow=bf16`) and with `-precision=bf16`, run on the GPU and compared with the reference (tolerance {TOL_FP16}).\n\n")
        f.write("| targets | plan | rel. error vs reference | result |\n|---|---|---|---|\n")
        for targets, what, e, good in rows:
            f.write(f"| {' + '.join('`' + t + '`' for t in targets)} | {what} | {'-' if e is None else f'{e:.2e}'} | {'pass' if good else 'FAIL'} |\n")
        f.write(f"\n`-overflow=error`: {'refused, naming scale_up' if refused else 'NOT refused: ' + err[-300:]}\n")
    print(open(report).read())
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
