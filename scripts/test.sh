#!/usr/bin/env bash
# Runs tessera's whole test suite on a fresh machine: installs what the tests need, then `cargo test`.
# Usage: bash scripts/test.sh [extra cargo test args]
set -euo pipefail
cd "$(dirname "$0")/.."

# The ONNX backend test data ships inside the `onnx` Python package (onnx/backend/test/data/).
# Pinned so the suite's expected outputs do not move under us.
python3 -m pip install --quiet --disable-pip-version-check 'onnx==1.23.2' 'numpy>=1.26'
ONNX_BACKEND_DATA="$(python3 -c 'import onnx, os; print(os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data"))')"
export ONNX_BACKEND_DATA

command -v cc >/dev/null || { apt-get update -qq && apt-get install -y -qq gcc; }

cargo test --workspace --locked "$@"
