#!/usr/bin/env bash
# Runs tessera's whole test suite on a fresh machine: installs what the tests need, then `cargo test`, then the
# Python package's tests (scripts/test-python.sh). Runs as root or as a user (sudo for system packages, only
# where something is missing); never installs into a system Python (scripts/common.sh).
# Usage: bash scripts/test.sh [extra cargo test args]
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET="${CARGO_TARGET_DIR:-target}"
case "$TARGET" in /*) ;; *) TARGET="$PWD/$TARGET" ;; esac   # absolute: tests run from their crate's folder

. scripts/common.sh

# One build, run once: cargo's incremental caches (several GB for this workspace's test binaries) buy a one-shot
# run nothing, and a CI machine's disk is shared (a run once failed with "no space left on device" in the tests'
# temporary stores). Set CARGO_INCREMENTAL=1 to keep them when iterating.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

# Everything the tests take from PyPI goes into one virtual environment of this script's own ($TARGET/test-venv),
# never into a system Python, and that environment comes first on PATH (as `activate` puts it): tessera finds
# NVIDIA's and CUTLASS's wheels in the site-packages of the `python3` on PATH, and the tests that run Python
# (the ONNX backend suite's scripts, moto) run that one too.
VENV="$TARGET/test-venv"
make_venv "$VENV"
export VIRTUAL_ENV="$VENV" PATH="$VENV/bin:$PATH"

# The ONNX backend test data ships inside the `onnx` Python package (onnx/backend/test/data/).
# Pinned so the suite's expected outputs do not move under us.
venv_pip "$VENV" 'onnx==1.23.2' 'numpy>=1.26'
ONNX_BACKEND_DATA="$("$VENV/bin/python" -c 'import onnx, os; print(os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data"))')"
export ONNX_BACKEND_DATA

# NVRTC and the CUDA headers of the GPU machine's release (CUDA 13.0), from NVIDIA's PyPI wheels: the cuda
# backend's tests compile every generated kernel to an sm_90 cubin on this machine, GPU or not. tessera
# finds them under site-packages/nvidia/cu13 of the python3 on PATH (this venv's); TESSERA_REQUIRE_NVRTC makes
# a missing NVRTC a test failure rather than a skip.
venv_pip "$VENV" nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-runtime==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-cuda-cccl==13.0.85
export TESSERA_REQUIRE_NVRTC=1

# nvcc and the CUTLASS headers (the `cutlass` backend compiles CUTLASS templates with nvcc to sm_90 cubins, GPU or
# not), from the same release's PyPI wheels. nvidia-nvvm is pinned: unpinned, pip takes a newer one whose PTX the
# 13.0 ptxas rejects. TESSERA_REQUIRE_CUTLASS makes a missing toolchain a test failure rather than a skip.
venv_pip "$VENV" nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cutlass==4.2.0.0
export TESSERA_REQUIRE_CUTLASS=1

# A C compiler: the `c` backend compiles with it, and runtime-c/tests/c_program.rs builds examples/c/run.c
# against the C API's header and libraries (cbindgen, which checks the header, is a dev-dependency).
need_cc

# Real cache servers for the remote-tier tests (store/tests/remote.rs, pipeline/tests/remote*.rs start them on
# 127.0.0.1): Redis (Debian's is built with TLS), and nginx with its WebDAV modules (PUT/MKCOL built in, PROPFIND
# from dav_ext; TLS and basic authentication built in). Those tests fail, not skip, when a server is missing.
if ! command -v redis-server >/dev/null || ! [ -x /usr/sbin/nginx ] || ! [ -f /usr/lib/nginx/modules/ngx_http_dav_ext_module.so ]; then
    apt_install redis-server nginx libnginx-mod-http-dav-ext
fi
# The S3-compatible server: moto's server mode (it brings boto3, with which the tests make its user, key and
# bucket), pinned, in the same environment; the tests run it through TESSERA_TEST_PYTHON.
venv_pip "$VENV" 'moto[server]==5.2.1'
export TESSERA_TEST_PYTHON="$VENV/bin/python"

# Every crate's rust-version and README's "Rust 1.NN" are what the lock file needs (the newest rust-version a
# locked dependency declares): a dependency update that needs a newer Rust fails here, by name.
python3 scripts/check-rust-version.py
# And tessera's own code calls nothing of the standard library newer than that rust-version: clippy's
# incompatible_msrv lint, on its own (a check build, no code generated).
cargo clippy --version >/dev/null 2>&1 || rustup component add clippy \
    || { echo "scripts/test.sh: clippy is needed (rustup component add clippy)" >&2; exit 1; }
cargo clippy --workspace --all-targets --locked --quiet -- -A clippy::all -D clippy::incompatible_msrv

cargo test --workspace --locked "$@"

# The Python package (python/): the wheel as it is published, installed into a clean virtual environment and
# tested there with no Rust toolchain on PATH (its own script, which also runs alone).
bash scripts/test-python.sh
