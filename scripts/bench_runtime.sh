#!/usr/bin/env bash
# Serving figures of the runtime APIs (bench/runtime.md): builds the CLI, the Rust example
# examples/rust/serve_bench.rs, the C library and examples/c/serve_bench.c, and the Python wheel (release
# builds), compiles the models of scripts/bench_runtime.toml with the CLI for `-t cpu`, then per model:
# `tessera bench` (before and after the APIs, to bracket drift), and each API's latency and throughput on
# the same artifact and the same inputs (`tessera run --seed 0`'s). A benchmark, not a test: nothing fails on
# slow figures.
#
# Usage: bash scripts/bench_runtime.sh [NOTE]   NOTE (e.g. "a cargo build ran concurrently") goes in the file.
# Environment: BENCH_SECONDS (each throughput measurement, default 2), BENCH_TARGET_S (time per latency
# measurement, default 2), CC.
set -euo pipefail
cd "$(dirname "$0")/.."
NOTE="${1:-}"
SECONDS_EACH="${BENCH_SECONDS:-2}"
TARGET_S="${BENCH_TARGET_S:-2}"
TARGET="${CARGO_TARGET_DIR:-target}"
WORK="$TARGET/bench-runtime"
rm -rf "$WORK"
mkdir -p "$WORK"

cargo build --release --locked -p tessera -p tessera-runtime-c
cargo build --release --locked -p tessera-runtime --example serve_bench
REL="$TARGET/release"
"${CC:-cc}" -std=c11 -O2 -Wall -Werror examples/c/serve_bench.c -I runtime-c/include -L "$REL" -ltessera_runtime_c \
    -Wl,-rpath,"$(cd "$REL" && pwd)" -lpthread -o "$WORK/serve_bench_c"
# The wheel, built as it is published (manylinux_2_28 through maturin's zig linker, README's "Install"), in a
# virtual environment of its own with maturin, zig and NumPy: the benchmark neither needs nor touches a system
# Python or a tessera installed anywhere else.
. scripts/common.sh
make_venv "$WORK/venv"
venv_pip "$WORK/venv" 'maturin==1.16.0' 'ziglang==0.17.1' 'numpy>=1.26'
PATH="$WORK/venv/bin:$PATH" maturin build --release --locked --zig -m python/Cargo.toml --out "$WORK/wheels"
PY="$WORK/venv/bin/python"
venv_pip "$WORK/venv" --force-reinstall --no-deps "$WORK"/wheels/tessera_runtime-*.whl

TESSERA="$REL/tessera"
"$TESSERA" compile scripts/bench_runtime.toml -t cpu --costs analytical --store "$WORK/store" --out "$WORK/zoo" >/dev/null

# Whether other work shared the cores: the CPU time the whole machine used during the measurements
# (/proc/stat) minus what this script's own processes used (`times`: children waited for), against the
# core-seconds there were.
busy_s() { awk -v hz="$(getconf CLK_TCK)" '/^cpu /{print ($2+$3+$4+$7+$8+$9)/hz}' /proc/stat; }
# `times` must run in this shell itself (a command substitution's subshell has no children of its own).
secs() { tail -1 "$1" | awk '{s=0; for(i=1;i<=2;i++){split($i,a,/[ms]/); s+=a[1]*60+a[2]}; print s}'; }
LOAD_BEFORE="$(cut -d' ' -f1-3 /proc/loadavg)"
times > "$WORK/times0"; T0="$(date +%s.%N)"; B0="$(busy_s)"; M0="$(secs "$WORK/times0")"
RESULTS="$WORK/results.jsonl"
: > "$RESULTS"
for artifact in "$WORK"/zoo/*.tsr; do
    name="$(basename "$artifact" .tsr)"
    echo "== $name" >&2
    # The inputs `tessera bench --seed 0` draws, as raw bytes in model order (INDIR/i.bin) for every API.
    "$TESSERA" run "$artifact" --seed 0 --out "$WORK/in/$name/npy" >/dev/null
    "$PY" - "$artifact" "$WORK/in/$name" <<'PYEOF'
import sys, numpy as np, tessera
m = tessera.load(sys.argv[1])
for i, (name, dtype, shape) in enumerate(m.inputs):
    a = np.load(f"{sys.argv[2]}/npy/{name}.npy")
    assert a.dtype == np.dtype(dtype) and list(a.shape) == list(shape), name
    a.tofile(f"{sys.argv[2]}/{i}.bin")
PYEOF
    # Iterations: about TARGET_S seconds of runs at `tessera bench`'s median, between 50 and 5000.
    probe="$("$TESSERA" bench "$artifact" --iters 20 --warmup 5 --json | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["results"][0]["median_ms"])')"
    iters="$("$PY" -c "print(max(50, min(5000, int($TARGET_S * 1000 / $probe))))")"
    warmup=$(( iters / 10 > 10 ? iters / 10 : 10 ))
    bench() {
        "$TESSERA" bench "$artifact" --iters "$iters" --warmup "$warmup" --seed 0 --json \
            | "$PY" -c "import json,sys; r=json.load(sys.stdin)['results'][0]; print(json.dumps({'api': 'tessera bench ($1)', 'model': r['model'], 'iters': r['iters'], 'median_us': r['median_ms']*1e3, 'p10_us': r['p10_ms']*1e3, 'p90_us': r['p90_ms']*1e3}))"
    }
    bench before >> "$RESULTS"
    "$REL/examples/serve_bench" "$artifact" "$WORK/in/$name" "$iters" "$warmup" "$SECONDS_EACH" >> "$RESULTS"
    "$WORK/serve_bench_c" "$artifact" "$WORK/in/$name" "$iters" "$warmup" "$SECONDS_EACH" >> "$RESULTS"
    "$PY" examples/python/serve_bench.py "$artifact" "$WORK/in/$name" "$iters" "$warmup" "$SECONDS_EACH" >> "$RESULTS"
    bench after >> "$RESULTS"
done
LOAD_AFTER="$(cut -d' ' -f1-3 /proc/loadavg)"
times > "$WORK/times1"; T1="$(date +%s.%N)"; B1="$(busy_s)"; M1="$(secs "$WORK/times1")"
OTHER="$(awk -v b0="$B0" -v b1="$B1" -v m0="$M0" -v m1="$M1" -v n="$(nproc)" -v t0="$T0" -v t1="$T1" \
    'BEGIN{o=(b1-b0)-(m1-m0); if (o < 0) o = 0; w=(t1-t0)*n; printf "%.1f CPU-seconds of other processes in %.0f core-seconds of measurement (%.1f%%)", o, w, 100*o/w}')"

"$PY" scripts/bench_runtime_report.py "$RESULTS" bench/runtime.md \
    --cpu "$(lscpu | sed -n 's/^Model name: *//p' | head -1)" --cores "$(nproc)" --date "$(date -u '+%Y-%m-%d %H:%M UTC')" \
    --load-before "$LOAD_BEFORE" --load-after "$LOAD_AFTER" --other "$OTHER" --seconds "$SECONDS_EACH" --note "$NOTE" \
    --rev "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!bench' || echo '+changes')"
echo "wrote bench/runtime.md" >&2
