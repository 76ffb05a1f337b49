"""Writes bench/runtime.md from the JSON lines scripts/bench_runtime.sh collects (one line per API and model)."""

import argparse
import json
from collections import OrderedDict

API_ORDER = ["rust run", "rust run_into", "c", "python"]
API_NAMES = {
    "rust run": "Rust `Model::run`",
    "rust run_into": "Rust `Model::run_into`",
    "c": "C `tessera_model_run`",
    "python": "Python `Model.run`",
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("results")
    p.add_argument("out")
    for flag in ["--cpu", "--cores", "--date", "--load-before", "--load-after", "--other", "--seconds", "--note", "--rev"]:
        p.add_argument(flag, required=True)
    a = p.parse_args()

    rows = OrderedDict()
    with open(a.results) as f:
        for line in f:
            r = json.loads(line)
            rows.setdefault(r["model"], {})[r["api"]] = r

    cores = int(a.cores)
    out = []
    out.append("# Serving through the runtime APIs\n")
    out.append(
        f"Machine: {a.cpu}, {cores} cores (`nproc`). Date: {a.date}. Revision: {a.rev}. Produced by "
        "`bash scripts/bench_runtime.sh` (release builds; artifacts compiled by the CLI for `-t cpu` with "
        "`--costs analytical` from `scripts/bench_runtime.toml`; every API runs the same artifact on the same inputs, "
        "those `tessera bench --seed 0` draws).\n"
    )
    concurrency = a.note or "none recorded"
    out.append(
        f"Other work on the machine: {concurrency}. Measured: {a.other} (the machine's CPU time from /proc/stat "
        f"minus the benchmark's own processes'). Load average (1, 5, 15 min) {a.load_before} before the "
        f"measurements (just after the builds), {a.load_after} after. With {cores} cores, {'4 threads oversubscribe the machine, and ' if cores < 4 else ''}"
        "host runs execute on the runtime's pool of one thread per core, so callers beyond the core count queue "
        "there rather than add throughput.\n"
    )
    out.append("## Latency of one run\n")
    out.append(
        "Median (p10-p90) of one run on one thread after warm-up, in microseconds. `tessera bench` times "
        "`Executable::run` (inputs copied in, outputs allocated and copied out) and ran before and after the "
        "APIs; overhead is an API's median minus the mean of those two medians, so differences within the "
        "spread of the two `tessera bench` runs are noise. Rust `run` allocates its outputs as `tessera bench` does; "
        "`run_into` and C write into buffers allocated once; Python returns new NumPy arrays and converts the "
        "input dict each call.\n"
    )
    header = "| model | iters | tessera bench (before / after) |" + "".join(f" {API_NAMES[k]} |" for k in API_ORDER)
    out.append(header)
    out.append("|---|---:|---:|" + "---:|" * len(API_ORDER))
    for model, r in rows.items():
        before, after = r["tessera bench (before)"], r["tessera bench (after)"]
        base = (before["median_us"] + after["median_us"]) / 2
        cells = [model, str(before["iters"]), f"{before['median_us']:.1f} / {after['median_us']:.1f}"]
        for k in API_ORDER:
            x = r[k]
            cells.append(f"{x['median_us']:.1f} ({x['p10_us']:.0f}-{x['p90_us']:.0f}), {x['median_us'] - base:+.1f}")
        out.append("| " + " | ".join(cells) + " |")
    out.append("")
    out.append("## Throughput on one loaded model\n")
    out.append(
        f"Runs per second with 1, 2 and 4 caller threads sharing one loaded model, each thread looping for "
        f"{a.seconds} s with its own output buffers (Rust: `run_into`; C: `tessera_model_run`; Python: "
        "`Model.run`, threads of one interpreter, the GIL released while a run executes).\n"
    )
    apis = ["rust run_into", "c", "python"]
    out.append("| model |" + "".join(f" {API_NAMES[k]} 1 / 2 / 4 threads |" for k in apis))
    out.append("|---|" + "---:|" * len(apis))
    for model, r in rows.items():
        cells = [model]
        for k in apis:
            x = r[k]
            cells.append(" / ".join(f"{x[f'runs_per_s_{t}']:.0f}" for t in (1, 2, 4)))
        out.append("| " + " | ".join(cells) + " |")
    out.append("")
    with open(a.out, "w") as f:
        f.write("\n".join(out))


if __name__ == "__main__":
    main()
