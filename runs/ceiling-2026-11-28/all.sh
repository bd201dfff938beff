#!/bin/bash
# Every figure of docs/performance.md's "Where the small model's request spends its time":
# MODE (count, profile or cpu) for each target, its output in OUT/MODE-TARGET.txt.
# usage: runs/ceiling-2026-11-28/all.sh MODE OUT [REQUESTS]   (from a checkout's root)
mode=$1 out=$2 requests=${3:-6400}
here=$(dirname "$0")
mkdir -p "$out"
for target in asgi-floor floor-served v1 v2-json grpc-floor grpc; do
  "${PYTHON:-python}" "$here/where.py" "$mode" "$target" "$requests" 64 "$out/$mode-$target.data" \
    > "$out/$mode-$target.txt" 2>&1
done
