#!/usr/bin/env bash
# Runs tessera's whole test suite on a fresh machine: installs what the tests need, then `cargo test`.
# Usage: bash scripts/test.sh [extra cargo test args]
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET="${CARGO_TARGET_DIR:-target}"
case "$TARGET" in /*) ;; *) TARGET="$PWD/$TARGET" ;; esac   # absolute: tests run from their crate's folder

# Installing system packages needs root: run as root (CI), or through sudo where it exists.
as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"
    elif command -v sudo >/dev/null; then sudo "$@"
    else echo "scripts/test.sh: '$*' needs root, and sudo is not installed" >&2; return 1
    fi
}

# The ONNX backend test data ships inside the `onnx` Python package (onnx/backend/test/data/).
# Pinned so the suite's expected outputs do not move under us.
python3 -m pip install --quiet --disable-pip-version-check 'onnx==1.23.2' 'numpy>=1.26'
ONNX_BACKEND_DATA="$(python3 -c 'import onnx, os; print(os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data"))')"
export ONNX_BACKEND_DATA

# NVRTC and the CUDA headers of the GPU machine's release (CUDA 13.0), from NVIDIA's PyPI wheels: the cuda
# backend's tests compile every generated kernel to an sm_90 cubin on this machine, GPU or not. tessera
# finds them under site-packages/nvidia/cu13 by itself; TESSERA_REQUIRE_NVRTC makes a missing NVRTC a test
# failure rather than a skip.
python3 -m pip install --quiet --disable-pip-version-check nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-runtime==13.0.88 \
    nvidia-cuda-crt==13.0.88 nvidia-cuda-cccl==13.0.85
export TESSERA_REQUIRE_NVRTC=1

# nvcc and the CUTLASS headers (the `cutlass` backend compiles CUTLASS templates with nvcc to sm_90 cubins, GPU or
# not), from the same release's PyPI wheels. nvidia-nvvm is pinned: unpinned, pip takes a newer one whose PTX the
# 13.0 ptxas rejects. TESSERA_REQUIRE_CUTLASS makes a missing toolchain a test failure rather than a skip.
python3 -m pip install --quiet --disable-pip-version-check nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cutlass==4.2.0.0
export TESSERA_REQUIRE_CUTLASS=1

# A C compiler: the `c` backend compiles with it, and runtime-c/tests/c_program.rs builds examples/c/run.c
# against the C API's header and libraries (cbindgen, which checks the header, is a dev-dependency).
command -v cc >/dev/null || { as_root apt-get update -qq && as_root apt-get install -y -qq gcc; }

# Real cache servers for the remote-tier tests (store/tests/remote.rs, pipeline/tests/remote*.rs start them on
# 127.0.0.1): Redis (Debian's is built with TLS), and nginx with its WebDAV modules (PUT/MKCOL built in, PROPFIND
# from dav_ext; TLS and basic authentication built in). Those tests fail, not skip, when a server is missing.
if ! command -v redis-server >/dev/null || ! [ -x /usr/sbin/nginx ] || ! [ -f /usr/lib/nginx/modules/ngx_http_dav_ext_module.so ]; then
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server nginx libnginx-mod-http-dav-ext >/dev/null
fi
# The S3-compatible server: moto's server mode (it brings boto3, with which the tests make its user, key and
# bucket), pinned, in a virtual environment of its own (never the system's Python); the tests run it through
# TESSERA_TEST_PYTHON.
VENV="$TARGET/test-venv"
if ! [ -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV" 2>/dev/null || { as_root apt-get update -qq && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null && python3 -m venv "$VENV"; }
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check 'moto[server]==5.2.1'
export TESSERA_TEST_PYTHON="$VENV/bin/python"

cargo test --workspace --locked "$@"

# The Python API (python/): the abi3 wheel built with maturin (dev profile, so it reuses the build above),
# installed, and its pytest tests run on zoo artifacts compiled by the tessera CLI, compared with `tessera run`.
python3 -m pip install --quiet --disable-pip-version-check 'maturin==1.16.0' 'pytest==9.2.0'
rm -rf "$TARGET/wheels" "$TARGET/pytest"
maturin build --locked -m python/Cargo.toml --out "$TARGET/wheels"
python3 -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps "$TARGET"/wheels/tessera_runtime-*.whl
cargo build --locked -p tessera
"$TARGET/debug/tessera" compile python/tests/zoo.toml -t cpu -t 'cpu -compiler=gemm' --costs analytical \
    --store "$TARGET/pytest/store" --out "$TARGET/pytest/zoo"
TESSERA_ZOO="$TARGET/pytest/zoo" TESSERA_BIN="$TARGET/debug/tessera" python3 -m pytest -q python/tests
