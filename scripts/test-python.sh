#!/usr/bin/env bash
# The Python package's tests (python/): builds the wheel as it is published (abi3, manylinux_2_28 through
# maturin's zig linker), installs it into a fresh virtual environment holding nothing else but pytest, and runs
# python/tests there with no Rust toolchain on PATH: the installed `tessera` command and `tessera.load` /
# `tessera.compile`, against the `tessera` binary of this checkout.
# Run by scripts/test.sh after `cargo test`; runs alone too. Root or user, like scripts/test.sh.
# Usage: bash scripts/test-python.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET="${CARGO_TARGET_DIR:-target}"
case "$TARGET" in /*) ;; *) TARGET="$PWD/$TARGET" ;; esac

. scripts/common.sh
need_cc

# The build tools, in the test tools' environment (scripts/test.sh's): maturin, and zig from PyPI's ziglang, which
# maturin runs as the linker (`python3 -m ziglang`) so the extension binds glibc 2.28's symbols whatever this
# machine's glibc is; pyproject.toml asks for manylinux_2_28, and maturin refuses to tag a wheel whose library
# needs anything newer. The dev profile: the wheel's code is the release one's, built faster (the zig build has
# its own target folder, $TARGET/x86_64-unknown-linux-gnu).
TOOLS="$TARGET/test-venv"
make_venv "$TOOLS"
venv_pip "$TOOLS" 'maturin==1.16.0' 'ziglang==0.17.1'
rm -rf "$TARGET/wheels" "$TARGET/pytest"
PATH="$TOOLS/bin:$PATH" maturin build --locked --zig -m python/Cargo.toml --out "$TARGET/wheels"

# A clean environment: the wheel and what it depends on (NumPy) from PyPI, and pytest; nothing of the tools'.
CLEAN="$TARGET/wheel-venv"
rm -rf "$CLEAN"
make_venv "$CLEAN"
venv_pip "$CLEAN" "$TARGET"/wheels/tessera_runtime-*.whl 'pytest==9.2.0'

# The binary the tests compare against (the one `cargo test --workspace` builds for tests/processes.rs: asked for
# again, the same build is a no-op after scripts/test.sh's, where `cargo build -p tessera` would build the
# dependencies once more with that package's features alone), and zoo artifacts it compiles.
cargo test --workspace --locked --no-run
"$TARGET/debug/tessera" compile python/tests/zoo.toml -t cpu -t 'cpu -compiler=gemm' --costs analytical \
    --store "$TARGET/pytest/store" --out "$TARGET/pytest/zoo"

# PATH without the Rust toolchain: every folder holding cargo or rustc is left out (python/tests/test_command.py
# checks that neither is found), and so is the tools' environment; the clean one comes first, as its `activate`
# would put it.
path=""
IFS=: read -r -a dirs <<<"$PATH"
for d in "${dirs[@]}"; do
    { [ -z "$d" ] || [ "$d" = "$TOOLS/bin" ] || [ -e "$d/cargo" ] || [ -e "$d/rustc" ]; } && continue
    path="${path:+$path:}$d"
done
command -v cc >/dev/null && ! PATH="$path" command -v cc >/dev/null \
    && { echo "scripts/test-python.sh: the C compiler shares a folder with cargo or rustc; cannot take Rust off PATH" >&2; exit 1; }

# pytest keeps its temporary folders (1.3 GB a run) under the target, not /tmp; they go when the tests pass.
cd "$TARGET/pytest"   # not the checkout: `import tessera` must find the installed package, never python/tessera
env PATH="$CLEAN/bin:$path" VIRTUAL_ENV="$CLEAN" TESSERA_ZOO="$TARGET/pytest/zoo" \
    TESSERA_BIN="$TARGET/debug/tessera" "$CLEAN/bin/python" -m pytest -q -p no:cacheprovider --basetemp "$TARGET/pytest/tmp" "$OLDPWD/python/tests" "$@"
rm -rf "$TARGET/pytest/tmp"   # passed: nothing there to look at
