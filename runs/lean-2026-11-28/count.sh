#!/bin/bash
# Instructions of REQUESTS in-process V1 requests at concurrency CONC in MODE (count.py) through
# CHECKOUT's HTTP app, every thread counted by callgrind; prints instructions per request.
# usage: runs/lean-2026-11-28/count.sh CHECKOUT REQUESTS CONC MODE OUT
here=$(cd "$(dirname "$0")" && pwd)
cd "$1" && valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$5" \
  "${PYTHON:-python}" "$here/count.py" model_repository "$2" "$3" "$4" >/dev/null 2>"$5.log"
total=$(grep -E "^totals" "$5" | awk '{print $2}')
echo "$4 c=$3 $((total / $2)) instructions/request"
