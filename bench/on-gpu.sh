#!/usr/bin/env bash
# On a lent GPU machine, after ../shared/gpu/unpack.sh (../shared/GPU.md): the CUDA tests, the
# fast suite, and bench.gpu's rows, written under $OUT (default ./gpu-run). One prepared call:
#   bash bench/on-gpu.sh     (model_repository/ built here and carried, or rebuilt there)
set -uo pipefail
out=${OUT:-gpu-run}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/device.csv" 2>&1
python3 -c "import onnxruntime as o; print(o.__version__, o.get_available_providers())" | tee "$out/ort.txt"
python3 -m pytest -q -p no:cacheprovider tests/service/test_cuda.py tests/service/test_runtime.py \
    2>&1 | tail -15 | tee "$out/cuda-tests.txt"
python3 -m bench.gpu --out "$out/gpu.json" 2>&1 | tail -5
python3 -m pytest -q -p no:cacheprovider -m "not slow" tests/service tests/contract -x \
    2>&1 | tail -5 | tee "$out/fast-suite.txt"
