#!/usr/bin/env bash
# The main job: build tessera (release) and compile the bundled model zoo (fixtures/zoo.toml) with the
# embedded store (.tessera/ here, or $TESSERA_STORE), for every backend this machine can run.
# Artifacts land in out/<model>.tsr; a second run is served from the store.
# Usage: bash scripts/zoo.sh [extra `tessera compile` args, e.g. --json or --target 'cpu -compiler=gemm']
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh
need_cc   # the `c` backend compiles with it (installed as root, or through sudo)
# `cargo run` finds the binary wherever CARGO_TARGET_DIR puts it.
exec cargo run --quiet --release --locked -p tessera -- compile fixtures/zoo.toml --out out "$@"
