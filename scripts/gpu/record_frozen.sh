#!/usr/bin/env bash
# Records fixtures/frozen/ on the GPU machine: a measured fp16 build of two zoo models for `cuda` + `cublas` +
# `cudnn`, the tune and plan-timing records it made (records.tar), the GPU's fingerprint (gpu.json) and the
# digests of the artifacts it built (expected.json). pipeline/tests/frozen.rs imports the records on the CPU
# machine, rebuilds with `tessera compile --frozen --measured-on gpu.json`, and must get the same digests.
#
# Usage, on the GPU machine from the repository root, with the release binary staged in .gpu/bin
# (../shared/gpu/stage.sh, or just `cargo build --release -p tessera --bin tessera` and a copy):
#   REV=$(git rev-parse --short HEAD) scripts/gpu/record_frozen.sh OUT_DIR
# then copy OUT_DIR/{records.tar,gpu.json,expected.json} into fixtures/frozen/.
set -euo pipefail
bin=${TESSERA:-.gpu/bin/tessera}
out=${1:?usage: record_frozen.sh OUT_DIR}
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

inputs=(fixture:mlp3:b8 fixture:resnet18:b1)
targets=("cuda -compiler=nvrtc -precision=fp16" "cuda -compiler=cublas -precision=fp16" "cuda -compiler=cudnn -precision=fp16")
target_args=()
for t in "${targets[@]}"; do target_args+=(--target "$t"); done

"$bin" targets --gpu-fingerprint > "$out/gpu.json"
"$bin" compile "${inputs[@]}" "${target_args[@]}" --store "$work/store" --out "$work/out" --json > "$out/summary.json"
"$bin" store export --store "$work/store" --stage tune --stage time-plans "$out/records.tar"

# The same build from the records alone, here: a first check of what the CPU machine will do.
"$bin" store import --store "$work/frozen" "$out/records.tar"
"$bin" compile "${inputs[@]}" "${target_args[@]}" --store "$work/frozen" --out "$work/frozen-out" --json --frozen \
  --measured-on "$out/gpu.json" > "$out/frozen_here.json"

python3 - "$out" "${REV:-unknown}" "${inputs[@]}" -- "${targets[@]}" <<'EOF'
import datetime, json, sys
out, rev = sys.argv[1], sys.argv[2]
rest = sys.argv[3:]
split = rest.index("--")
inputs, targets = rest[:split], rest[split + 1:]
summary = json.load(open(f"{out}/summary.json"))
frozen = json.load(open(f"{out}/frozen_here.json"))
gpu = json.load(open(f"{out}/gpu.json"))
# Digests are 64 hex characters in tessera's JSON (before issue 29 they were arrays of 32 byte values).
hexd = lambda d: d if isinstance(d, str) else bytes(d).hex()
artifacts = {a["model"]: hexd(a["digest"]) for a in summary["artifacts"]}
again = {a["model"]: hexd(a["digest"]) for a in frozen["artifacts"]}
expected = {
    "recorded": f"{datetime.date.today()}, {gpu['name']} ({gpu['arch']}, driver CUDA {gpu['driver_cuda']}, cuBLASLt {gpu['cublaslt_version']}, cuDNN {gpu['cudnn_version']}), tessera {rev}",
    "targets": targets,
    "inputs": inputs,
    "artifacts": artifacts,
    "partitions_by_backend": {a["model"]: a["partitions_by_backend"] for a in summary["artifacts"]},
    "tuned_configs": {a["model"]: a.get("tuned_configs", {}) for a in summary["artifacts"]},
    "tune_executions": summary["stages"].get("tune", {}).get("executions", 0),
    "frozen_rebuild_here_matches": again == artifacts,
}
json.dump(expected, open(f"{out}/expected.json", "w"), indent=2, sort_keys=True)
print(json.dumps(expected, indent=2, sort_keys=True))
EOF
