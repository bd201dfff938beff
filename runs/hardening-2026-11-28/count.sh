#!/bin/bash
# Instructions of REQUESTS in-process V1 requests at concurrency CONC through CHECKOUT's HTTP
# app, counted by callgrind (asgi_instructions.py); prints the window's totals line.
# usage: runs/hardening-2026-11-28/count.sh CHECKOUT REQUESTS CONC OUT   (e.g. ... 640 64 /tmp/x.cg)
here=$(cd "$(dirname "$0")" && pwd)
cd "$1" && valgrind --tool=callgrind --instr-atstart=no --collect-atstart=no \
  --toggle-collect=_operator_call --callgrind-out-file="$4" \
  "${PYTHON:-python}" "$here/asgi_instructions.py" model_repository "$2" "$3" >/dev/null 2>"$4.log"
grep -E "^totals" "$4"
