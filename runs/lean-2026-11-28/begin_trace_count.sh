#!/bin/bash
# Instructions per begin_trace call of a request sampled out, in CHECKOUT (begin_trace_count.py):
# N calls less N calls of a function that does nothing, over N.
# usage: runs/lean-2026-11-28/begin_trace_count.sh CHECKOUT N OUT
here=$(cd "$(dirname "$0")" && pwd)
cd "$1" || exit 1
for what in begin_trace nothing; do
  COUNT_WHAT=$what valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$3.$what" \
    "${PYTHON:-python}" "$here/begin_trace_count.py" "$2" >/dev/null 2>"$3.$what.log" || exit 1
done
called=$(grep -E "^totals" "$3.begin_trace" | awk '{print $2}')
nothing=$(grep -E "^totals" "$3.nothing" | awk '{print $2}')
echo "begin_trace, sampled out: $(((called - nothing) / $2)) instructions/call"
