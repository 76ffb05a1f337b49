#!/usr/bin/env python3
"""Re-expresses ONNX backend node cases written at an opset above the importer's newest, where that is exact,
so ONNX's own expected outputs still check tessera's importer: a case qualifies when each of its ops means the
same at its opset and at TARGET (default 21): the same schema, or schemas that differ in type constraints only
(the same attributes, inputs, outputs and documentation, e.g. Einsum-28 and Celu-28, which added bfloat16), and
the case's input and output types are ones the op allows at TARGET. Its opset import becomes TARGET; with --f32,
DOUBLE inputs and outputs become FLOAT (the data rounded once; expected outputs too, so only the computation's
own rounding differs, which the case's rtol covers).

Usage: python3 scripts/onnx-node-reexpress.py NODE_ROOT OUT [--only REGEX] [--f32] [--target N]
NODE_ROOT holds node/ (as scripts/onnx-node-tests.py writes it); OUT gets node/<case>/ for each qualifying
case, plus node/complete, so `ONNX_NODE_DATA=OUT cargo test -p tessera-tests --test onnx_backend` runs them.
"""
import argparse
import os
import re
import shutil

import numpy as np
import onnx
import onnx.defs
from onnx import TensorProto, numpy_helper


def same_meaning(op, v, target, types):
    new, old = onnx.defs.get_schema(op, v, ""), onnx.defs.get_schema(op, target, "")
    if new.since_version == old.since_version:
        return True
    key = lambda s: (
        sorted((k, x.type, x.required) for k, x in s.attributes.items()),
        [(x.name, x.option) for x in s.inputs],
        [(x.name, x.option) for x in s.outputs],
        s.doc,
    )
    allowed = {t for c in old.type_constraints for t in c.allowed_type_strs}
    return key(new) == key(old) and types <= allowed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("out")
    ap.add_argument("--only", default=".*")
    ap.add_argument("--f32", action="store_true")
    ap.add_argument("--target", type=int, default=21)
    a = ap.parse_args()
    src, dst = os.path.join(a.root, "node"), os.path.join(a.out, "node")
    shutil.rmtree(dst, ignore_errors=True)
    os.makedirs(dst)
    n = 0
    for case in sorted(os.listdir(src)):
        d = os.path.join(src, case)
        if not re.search(a.only, case) or not os.path.isfile(os.path.join(d, "model.onnx")):
            continue
        m = onnx.load(os.path.join(d, "model.onnx"))
        oi = [o for o in m.opset_import if o.domain in ("", "ai.onnx")]
        if not oi or oi[0].version <= a.target:
            continue
        v = oi[0].version
        if a.f32:
            for vi in list(m.graph.input) + list(m.graph.output):
                if vi.type.tensor_type.elem_type == TensorProto.DOUBLE:
                    vi.type.tensor_type.elem_type = TensorProto.FLOAT
        types = {f"tensor({onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type).name})" for vi in list(m.graph.input) + list(m.graph.output) if vi.type.HasField("tensor_type")}
        types = {t.replace("float64", "double").replace("float32", "float") for t in types}
        try:
            same = all(same_meaning(nd.op_type, v, a.target, types) for nd in m.graph.node if nd.domain in ("", "ai.onnx"))
        except (onnx.defs.SchemaError, TypeError, KeyError):
            same = False
        if not same or m.functions:
            continue
        oi[0].version = a.target
        os.makedirs(os.path.join(dst, case))
        onnx.save(m, os.path.join(dst, case, "model.onnx"))
        shutil.copy(os.path.join(d, "data.json"), os.path.join(dst, case, "data.json"))
        for ds in sorted(os.listdir(d)):
            if not ds.startswith("test_data_set"):
                continue
            os.makedirs(os.path.join(dst, case, ds))
            for f in sorted(os.listdir(os.path.join(d, ds))):
                t = onnx.load_tensor(os.path.join(d, ds, f))
                if a.f32 and t.data_type == TensorProto.DOUBLE:
                    t = numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float32), t.name)
                onnx.save_tensor(t, os.path.join(dst, case, ds, f))
        n += 1
    with open(os.path.join(dst, "complete"), "w") as f:
        f.write(f"{n}\n")
    print(f"re-expressed {n} cases at opset {a.target} under {dst}")


if __name__ == "__main__":
    main()
