#!/usr/bin/env python3
"""Writes bench/onnx_coverage.md: per ONNX op of opsets 13-21, whether tessera's importer claims it and how its
ONNX backend *node* test cases fare.

Input: the JSON report of the backend suite (tests/onnx_backend.rs), written when ONNX_BACKEND_REPORT is set:

    ONNX_BACKEND_REPORT=/tmp/onnx-report.json cargo test -p tessera-tests --test onnx_backend
    python3 scripts/onnx-node-reexpress.py NODE_ROOT /tmp/reexp --f32
    ONNX_NODE_DATA=/tmp/reexp ONNX_BACKEND_REPORT=/tmp/onnx-reexp.json cargo test -p tessera-tests --test onnx_backend
    python3 scripts/onnx-coverage.py /tmp/onnx-report.json DATE [/tmp/onnx-reexp.json] > bench/onnx_coverage.md

(NODE_ROOT: the folder holding node/, which the suite writes under Cargo's target tmp dir, `onnx-node-<version>`.)
The optional second report, of the cases scripts/onnx-node-reexpress.py re-expressed at opset 21, adds a
column: cases written at a newer opset whose ops mean the same at 21 (Einsum-28 and Celu-28 only added types).

The ops are those of the default domain that ONNX (the installed `onnx` package) defines at some opset from 13
to 21. A node case counts for the op it tests: the one op of its graph (Constant nodes aside); for an
`_expanded` case (the op's function body written out), the op of the case without the suffix; otherwise the op
whose snake-case name the case name starts with, longest first. "Unsupported" cases are valid ONNX the importer
rejects by design (an opset above the importer's newest, a data type the IR lacks such as DOUBLE, an
attribute value...); the most frequent reason is shown.
"""
import collections
import json
import os
import re
import sys

import onnx
import onnx.defs


def snake(name):
    s = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    s = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", s)
    return s.lower()


def ops_of_opsets(lo, hi):
    ops = set()
    for s in onnx.defs.get_all_schemas_with_history():
        if s.domain not in ("", "ai.onnx"):
            continue
        for v in range(lo, hi + 1):
            try:
                schema = onnx.defs.get_schema(s.name, v, "")
            except onnx.defs.SchemaError:
                continue
            if not schema.deprecated:
                ops.add(s.name)
                break
    return sorted(ops)


def graph_ops(model_path):
    m = onnx.load(model_path, load_external_data=False)
    ops = {n.op_type for n in m.graph.node if n.domain in ("", "ai.onnx")} - {"Constant"}
    opset = next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), None)
    return ops, opset


def main():
    report = json.load(open(sys.argv[1]))
    date = sys.argv[2] if len(sys.argv) > 2 else "(undated)"
    reexp = json.load(open(sys.argv[3])) if len(sys.argv) > 3 else None
    claimed = set(report["supported_ops"])
    ops = ops_of_opsets(13, 21)
    by_snake = sorted(((snake(o), o) for o in ops), key=lambda p: -len(p[0]))
    node_cases = [c for c in report["cases"] if c["kind"] == "node"]
    info = {c["name"]: graph_ops(c["model"]) for c in node_cases}
    reexp_cases = {c["name"]: c for c in (reexp or {"cases": []})["cases"] if c["kind"] == "node"}

    def tested_op(name):
        ops_in, _ = info[name]
        base = re.sub(r"_expanded.*$", "", name)
        if base != name and base in info and len(info[base][0]) == 1:
            return next(iter(info[base][0]))
        if len(ops_in) == 1:
            return next(iter(ops_in))
        rest = name[len("test_"):]
        for sn, op in by_snake:
            if rest == sn or rest.startswith(sn + "_"):
                return op
        return None

    per_op = collections.defaultdict(lambda: {"cases": 0, "passed": 0, "failed": 0, "opset": 0, "unsupported": collections.Counter(), "re": collections.Counter()})
    unattributed = 0
    for c in node_cases:
        op = tested_op(c["name"])
        if op is None:
            unattributed += 1
            continue
        r = per_op[op]
        r["cases"] += 1
        if c["outcome"] == "passed":
            r["passed"] += 1
        elif c["outcome"] == "failed":
            r["failed"] += 1
        elif c["detail"].startswith("opset "):
            r["opset"] += 1
            if c["name"] in reexp_cases:
                r["re"]["cases"] += 1
                r["re"][reexp_cases[c["name"]]["outcome"]] += 1
        else:
            r["unsupported"][c["detail"]] += 1

    rows = []
    totals = collections.Counter()
    for op in ops:
        r = per_op.get(op)
        claim = "yes" if op in claimed else "no"
        totals["ops"] += 1
        totals["claimed"] += op in claimed
        if not r or r["cases"] == 0:
            rows.append(f"| {op} | {claim} | 0 | | | | | |" + (" |" if reexp else ""))
            continue
        re_col = ""
        if reexp:
            q = r["re"]
            re_col = f" {q['passed']}/{q['cases']}" + (f", {q['failed']} failed" if q["failed"] else "") + " |" if q["cases"] else " |"
            for k in ("cases", "passed", "failed", "unsupported"):
                totals["re_" + k] += q[k]
        other = sum(r["unsupported"].values())
        why = ", ".join(f"{k} x{n}" for k, n in r["unsupported"].most_common(2))
        runnable = r["cases"] - r["opset"]
        rate = f"{100.0 * r['passed'] / r['cases']:.0f}%"
        rows.append(f"| {op} | {claim} | {r['cases']} | {r['passed']} ({rate}) | {r['failed']} | {r['opset']} | {other}{' (' + why + ')' if why else ''} | {runnable} |{re_col}")
        for k in ("cases", "passed", "failed", "opset"):
            totals[k] += r[k]
        totals["other"] += other
        totals["tested_ops"] += 1
        totals["claimed_and_passing"] += op in claimed and r["passed"] > 0

    out = []
    out.append("# ONNX op coverage (opsets 13-21)")
    out.append("")
    out.append(f"Produced {date} by `scripts/onnx-coverage.py` from the backend suite's per-case report:")
    out.append("")
    out.append("```")
    out.append("ONNX_BACKEND_REPORT=/tmp/onnx-report.json cargo test -p tessera-tests --test onnx_backend")
    if reexp:
        out.append("python3 scripts/onnx-node-reexpress.py target/tmp/onnx-node-" + onnx.__version__ + " /tmp/reexp --f32")
        out.append("ONNX_NODE_DATA=/tmp/reexp ONNX_BACKEND_REPORT=/tmp/onnx-reexp.json cargo test -p tessera-tests --test onnx_backend")
    out.append(f"python3 scripts/onnx-coverage.py /tmp/onnx-report.json {date}" + (" /tmp/onnx-reexp.json" if reexp else "") + " > bench/onnx_coverage.md")
    out.append("```")
    out.append("")
    out.append(f"onnx {onnx.__version__} (its node cases, written by scripts/onnx-node-tests.py); each case imported by tessera's "
               "importer and run by the reference interpreter, compared with NumPy's allclose at the case's tolerances. "
               "Ops: every default-domain op ONNX defines at some opset from 13 to 21. *Claimed*: the importer has a "
               "converter for it. A case counts for the op it tests (the graph's one op; an `_expanded` case, whose "
               "graph is the op's function body, for the op it expands; else by its name). *Opset*: the case is "
               "written at an opset above the importer's newest (22), rejected by name. *Other unsupported*: valid "
               "ONNX rejected by design (a data type the IR lacks, such as DOUBLE; an attribute value; a sequence "
               "input...), with the most frequent reasons. The pass rate is passed / cases.")
    out.append("")
    out.append(f"Totals: {totals['ops']} ops, {totals['claimed']} claimed; {totals['tested_ops']} with node cases; "
               f"{totals['cases']} cases: {totals['passed']} passed, {totals['failed']} failed, {totals['opset']} at a newer opset, "
               f"{totals['other']} otherwise unsupported" + (f"; {unattributed} cases not attributed to an op of opsets 13-21" if unattributed else "") + ".")
    if reexp:
        out.append("")
        out.append(f"Re-expressed at opset 21 (last column: passed / re-expressed, of the cases at a newer opset; DOUBLE data "
                   f"as FLOAT): {totals['re_cases']} cases, {totals['re_passed']} passed, {totals['re_failed']} failed, "
                   f"{totals['re_unsupported']} unsupported.")
        allre = [c for c in reexp["cases"] if c["kind"] == "node"]
        bad = [c for c in allre if c["outcome"] == "failed"]
        out.append("")
        out.append(f"The whole re-expressed run, ops outside this table included (e.g. opset 23's Attention): {len(allre)} cases, "
                   f"{sum(c['outcome'] == 'passed' for c in allre)} passed, {len(bad)} failed"
                   + (": " + "; ".join(f"`{c['name']}` ({c['detail']})" for c in bad) if bad else "") + ".")
        if bad:
            out.append("These count against no op of the table; the re-expression checks more of ONNX's expected outputs, "
                       "it claims no support for the newer opsets.")
    out.append("")
    out.append("| op | claimed | node cases | passed | failed | opset > 22 | other unsupported | cases at opset <= 22 |" + (" newer opset, re-expressed at 21: passed |" if reexp else ""))
    out.append("|---|---|---|---|---|---|---|---|" + ("---|" if reexp else ""))
    out.extend(rows)
    out.append("")
    print("\n".join(out))


if __name__ == "__main__":
    main()
