#!/usr/bin/env bash
# Many machines, one cache: the figures of bench/scale_out.md, counted from the builds' own --json summaries.
#  1. one process, cold, no remote: the stage executions a single machine does (and its wall time);
#  2. four processes at once, each with its own fresh local store, sharing one Redis (leases on): their
#     stage executions summed, against (1), and the wall time until the last one finishes;
#  3. a fifth process with a fresh store, served from the remote, against (4) a warm local rebuild of (1).
# Starts its own redis-server (no persistence) on a free port on 127.0.0.1 and stops it at the end.
# Usage: bash scripts/bench_scale.sh [MANIFEST, default fixtures/zoo.toml]   (prints markdown on stdout)
set -euo pipefail
cd "$(dirname "$0")/.."
manifest=${1:-fixtures/zoo.toml}
bin=${TESSERA_BIN:-target/release/tessera}
[ -x "$bin" ] || cargo build --release --locked -p tessera --bin tessera >&2
command -v redis-server >/dev/null || { echo "redis-server not found (apt-get install redis-server)" >&2; exit 1; }
work=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" --logfile "$work/redis.log" &
redis_pid=$!
trap 'kill $redis_pid 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
remote="redis://127.0.0.1:$port"

now() { date +%s.%N; }
# compile NAME [args...]: one build into $work/NAME-store, its summary in $work/NAME.json.
compile() {
    local name=$1; shift
    "$bin" compile "$manifest" --costs analytical --store "$work/$name-store" --out "$work/$name-out" --json "$@" >"$work/$name.json" 2>"$work/$name.log"
}

t0=$(now); compile single; t1=$(now)
single_s=$(echo "$t1 - $t0" | bc)

t0=$(now)
pids=()
for i in 1 2 3 4; do compile "w$i" --remote "$remote" & pids+=($!); done
for p in "${pids[@]}"; do wait "$p"; done
t1=$(now)
four_s=$(echo "$t1 - $t0" | bc)

t0=$(now); compile fresh --remote "$remote"; t1=$(now)
fresh_s=$(echo "$t1 - $t0" | bc)
# The warm local rebuild: the single process's store again, no remote.
t0=$(now); "$bin" compile "$manifest" --costs analytical --store "$work/single-store" --out "$work/warm-out" --json >"$work/warm.json" 2>"$work/warm.log"; t1=$(now)
warm_s=$(echo "$t1 - $t0" | bc)

python3 - "$work" "$single_s" "$four_s" "$fresh_s" "$warm_s" "$manifest" <<'EOF'
import json, sys
work, single_s, four_s, fresh_s, warm_s, manifest = sys.argv[1], *map(float, sys.argv[2:6]), sys.argv[6]
load = lambda n: json.load(open(f"{work}/{n}.json"))
def execs(s): return {k: v["executions"] for k, v in sorted(s["stages"].items())}
single = load("single")
workers = [load(f"w{i}") for i in range(1, 5)]
fresh, warm = load("fresh"), load("warm")
stages = sorted(set(execs(single)) | {k for w in workers for k in execs(w)})
tot = lambda d: sum(d.values())
print(f"manifest: {manifest}, {single['models']} models, --costs analytical, target cpu\n")
print("| stage | single process (cold) | " + " | ".join(f"worker {i}" for i in range(1, 5)) + " | 4 workers, total |")
print("|---|---:|" + "---:|" * 5)
for st in stages:
    ws = [execs(w).get(st, 0) for w in workers]
    print(f"| {st} | {execs(single).get(st, 0)} | " + " | ".join(map(str, ws)) + f" | {sum(ws)} |")
wt = [tot(execs(w)) for w in workers]
print(f"| **all** | **{tot(execs(single))}** | " + " | ".join(map(str, wt)) + f" | **{sum(wt)}** |\n")
def lease(w):
    r = w.get("remote") or {}
    return ", ".join(f"{k[6:]} {r.get(k, 0)}" for k in ["lease_taken", "lease_waits", "lease_served", "lease_takeovers", "lease_timeouts"])
for i, w in enumerate(workers, 1):
    r = w["remote"]
    print(f"- worker {i}: leases {lease(w)}; remote memo hits {r['memo_hits']}, objects fetched {r['objects_fetched']}, uploaded {r['objects_uploaded']}; disabled: {r['disabled']}")
print()
print("| run | wall time (s) | stage executions |")
print("|---|---:|---:|")
print(f"| one process, cold, no remote | {single_s:.2f} | {tot(execs(single))} |")
print(f"| four processes at once, one Redis (until the last finishes) | {four_s:.2f} | {sum(wt)} |")
fr = fresh["remote"]
print(f"| fifth process, fresh store, served from the remote | {fresh_s:.2f} | {tot(execs(fresh))} (memo hits from the remote: {fr['memo_hits']}, objects fetched: {fr['objects_fetched']}, {fr['bytes_fetched']} bytes) |")
print(f"| warm local rebuild of the single process's store | {warm_s:.2f} | {tot(execs(warm))} |")
digests = lambda s: sorted((a["model"], a["digest"]) for a in s["artifacts"])
same = all(digests(w) == digests(single) for w in workers + [fresh, warm])
print(f"\nartifacts identical across all seven builds: {same}")
EOF
