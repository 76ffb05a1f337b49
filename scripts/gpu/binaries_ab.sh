#!/usr/bin/env bash
# Usage, on the GPU machine with .gpu/bin/tessera-base and .gpu/bin/tessera staged: OUT=dir scripts/gpu/binaries_ab.sh
# Alternated A/B of two tessera binaries' cuda backend (nvrtc only, analytical costs: the same plan from both,
# only the kernels' code differs) on zoo fixtures: cold compile time and `tessera bench` medians (CUDA events
# around graph replays), R rounds alternating the binaries. Env: PRECS MODELS R ITERS. Output: $OUT/ab.txt.
set -u
W=/tmp/ab; mkdir -p $W
PRECS=${PRECS:-"fp16 fp32"}; R=${R:-3}; ITERS=${ITERS:-300}
MODELS=${MODELS:-"resnet50:b1 resnet50:b32 mobilenetv2:b1 bert-base:b1 bert-base:b8 gpt2:b1 vit-b16:b1"}
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $OUT/ab.txt
jobs_file=$W/jobs; : > $jobs_file
for p in $PRECS; do for s in $MODELS; do for b in tessera-base tessera; do echo "$p $s $b" >> $jobs_file; done; done; done
compile() {
  p=$1; s=$2; b=$3; d=$W/$b-$p-${s//:/-}
  t0=$(date +%s.%N)
  .gpu/bin/$b compile fixture:$s --target "cuda -compiler=nvrtc -precision=$p" --costs analytical --store $d/store --out $d/out -q > $d.log 2>&1
  rc=$?; t1=$(date +%s.%N)
  echo "compile $p $s $b rc=$rc $(python3 -c "print(round($t1-$t0,2))")s"
}
export -f compile; export W
# Eight compiles at a time (NVRTC is single-threaded per module; the machine has 16 cores).
xargs -P 8 -L 1 bash -c 'compile $0 $1 $2' < $jobs_file | tee -a $OUT/ab.txt
for p in $PRECS; do for s in $MODELS; do
  for r in $(seq $R); do for b in tessera-base tessera; do
    d=$W/$b-$p-${s//:/-}; a=$(ls $d/out/*.tsr 2>/dev/null | head -1)
    [ -n "$a" ] || { echo "bench $p $s $b r$r: no artifact"; continue; }
    ms=$(.gpu/bin/$b bench $a --iters $ITERS --warmup 30 --json 2>>$W/bench.err | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["results"][0]["median_ms"],4))')
    echo "bench $p $s $b r$r $ms"
  done; done | tee -a $OUT/ab.txt
done; done
tail -5 $W/bench.err >> $OUT/ab.txt 2>/dev/null
