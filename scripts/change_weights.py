#!/usr/bin/env python3
# Rewrites an ONNX model with every large float initializer (more than 64 elements, which no kernel embeds)
# scaled by FACTOR (default 1.25) and shifted by 0.01; the graph and small initializers stay (bench/compile_times.md,
# the weights-changed rebuild). Usage: scripts/change_weights.py IN OUT [FACTOR]
import sys, onnx, numpy as np
from onnx import numpy_helper
m = onnx.load(sys.argv[1])
n = 0
for t in m.graph.initializer:
    if t.data_type == onnx.TensorProto.FLOAT and int(np.prod(t.dims)) > 64:
        a = numpy_helper.to_array(t).astype(np.float32) * np.float32(float(sys.argv[3]) if len(sys.argv) > 3 else 1.25) + np.float32(0.01)
        t.CopyFrom(numpy_helper.from_array(a, t.name))
        n += 1
onnx.save(m, sys.argv[2])
print(f"{n} initializers changed")
