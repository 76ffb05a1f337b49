#!/usr/bin/env python3
"""The corpus of real exports (fixtures/corpus/) on the GPU: compiles every export for a target set as one
manifest (one store), runs each artifact on the recorded inputs and compares it with ONNX Runtime's recorded
outputs; counts the Attention nodes of each plan (`tessera explain` of the artifact) and where they run.

Relative error is max|got - want| / max|want|, below 1e-4 for fp32 targets and 1e-2 for fp16 (8e-2 bf16);
NaN never passes. Needs numpy only (no torch).

Usage: python3 scripts/gpu/corpus_check.py TESSERA WORKDIR REPORT.md [--target T ...] [--costs C]
  e.g. --target "cuda -precision=fp16" --target "cuda -compiler=cublas -precision=fp16"
       --target "cuda -compiler=cudnn -precision=fp16"
Exits non-zero on any failure.
"""
import argparse, json, os, subprocess, sys, time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(ROOT, "fixtures", "corpus")


def rel_err(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape or np.isnan(got).any():
        return float("inf")
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}\n{p.stderr[-2000:]}")
    return p.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tessera")
    ap.add_argument("work")
    ap.add_argument("report")
    ap.add_argument("--target", action="append", default=[])
    ap.add_argument("--costs", default="measured")
    a = ap.parse_args()
    targets = a.target or ["cuda -precision=fp16", "cuda -compiler=cublas -precision=fp16", "cuda -compiler=cudnn -precision=fp16"]
    tol = 8e-2 if any("bf16" in t for t in targets) else 1e-2 if any("fp16" in t for t in targets) else 1e-4
    store, out = os.path.join(a.work, "store"), os.path.join(a.work, "out")
    tflags = [x for t in targets for x in ("--target", t)]
    t0 = time.time()
    run([a.tessera, "compile", os.path.join(CORPUS, "corpus.toml"), *tflags, "--costs", a.costs, "--store", store, "--out", out, "-q"])
    compile_s = time.time() - t0
    manifest = json.load(open(os.path.join(CORPUS, "manifest.json")))
    rows, ok = [], True
    for m in manifest["models"]:
        if m["status"] != "ok":
            continue
        name, d = m["name"], os.path.join(CORPUS, m["name"])
        art = os.path.join(out, f"{name}.tsr")
        args = [a.tessera, "run", art, "--out", os.path.join(a.work, "got", name), "-q"]
        for f in sorted(os.listdir(os.path.join(d, "inputs"))):
            args += ["--input", f"{f[:-4]}={os.path.join(d, 'inputs', f)}"]
        row = {"name": name, "attention_layers": m["attention_layers"]}
        try:
            run(args)
            errs = [rel_err(np.load(os.path.join(a.work, "got", name, f)), np.load(os.path.join(d, "expected", f)))
                    for f in sorted(os.listdir(os.path.join(d, "expected")))]
            row["rel_err"] = max(errs)
            plan = json.loads(run([a.tessera, "explain", art, "--json"]))
            row["plan"] = {k: plan[k] for k in ("by_backend",) if k in plan}
            row["pass"] = row["rel_err"] < tol
        except Exception as e:  # a failure is a row, not the end of the run
            row["error"], row["pass"] = str(e)[-500:], False
        ok &= row["pass"]
        print(json.dumps(row), flush=True)
        rows.append(row)
    with open(a.report, "w") as f:
        f.write(f"Targets: {' + '.join(targets)}; costs {a.costs}; tolerance {tol}; cold compile of the whole corpus "
                f"{compile_s:.1f} s.\n\n| export | attention layers | relative error | pass |\n|---|---:|---:|---|\n")
        for r in rows:
            f.write(f"| {r['name']} | {r['attention_layers']} | {r.get('rel_err', float('nan')):.2e} | "
                    f"{'yes' if r['pass'] else 'NO: ' + r.get('error', '')[:80]} |\n")
    with open(os.path.splitext(a.report)[0] + ".json", "w") as f:
        json.dump({"targets": targets, "costs": a.costs, "tolerance": tol, "compile_s": compile_s, "rows": rows}, f, indent=1)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
