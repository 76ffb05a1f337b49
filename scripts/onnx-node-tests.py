#!/usr/bin/env python3
"""Writes the ONNX backend *node* test cases to disk, in the layout of the suite's other kinds.

Newer `onnx` wheels no longer ship `onnx/backend/test/data/node/`; the cases are generated in memory by
`onnx.backend.test.loader.load_model_tests(kind="node")` (each op's `expect()` examples). This script runs
that loader and writes, per case, `OUT/node/<case>/model.onnx`, `test_data_set_<i>/input_<j>.pb`,
`output_<j>.pb` and a `data.json` with the case's rtol/atol, exactly as `onnx.backend.test.cmd_tools`
serializes model cases. A `complete` marker is written last, so a partial run is never taken for data.

Usage: python3 scripts/onnx-node-tests.py OUT
"""
import json
import os
import shutil
import sys
import warnings


def write_value(path, value, type_proto, name):
    from onnx import TensorProto, numpy_helper

    if type_proto.HasField("sequence_type"):
        data = numpy_helper.from_list(value, name).SerializeToString()
    elif type_proto.HasField("optional_type"):
        data = numpy_helper.from_optional(value, name).SerializeToString()
    elif type_proto.HasField("map_type"):
        data = numpy_helper.from_dict(value, name).SerializeToString()
    elif isinstance(value, TensorProto):
        data = value.SerializeToString()
    else:
        data = numpy_helper.from_array(value, name).SerializeToString()
    with open(path, "wb") as f:
        f.write(data)


def main():
    out = os.path.join(sys.argv[1], "node")
    warnings.simplefilter("ignore")
    from onnx.backend.test.loader import load_model_tests

    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(out)
    cases = load_model_tests(kind="node")
    for case in cases:
        d = os.path.join(out, case.name)
        os.makedirs(d)
        with open(os.path.join(d, "model.onnx"), "wb") as f:
            f.write(case.model.SerializeToString())
        with open(os.path.join(d, "data.json"), "w") as f:
            json.dump({"rtol": case.rtol, "atol": case.atol}, f, sort_keys=True)
        for i, (inputs, outputs) in enumerate(case.data_sets):
            s = os.path.join(d, f"test_data_set_{i}")
            os.makedirs(s)
            graph = case.model.graph
            for j, v in enumerate(inputs):
                write_value(os.path.join(s, f"input_{j}.pb"), v, graph.input[j].type, graph.input[j].name)
            for j, v in enumerate(outputs):
                write_value(os.path.join(s, f"output_{j}.pb"), v, graph.output[j].type, graph.output[j].name)
    with open(os.path.join(out, "complete"), "w") as f:
        f.write(f"{len(cases)}\n")
    print(f"wrote {len(cases)} node cases to {out}")


if __name__ == "__main__":
    main()
