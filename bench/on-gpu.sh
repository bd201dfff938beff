#!/usr/bin/env bash
# On a lent GPU machine, after ../shared/gpu/unpack.sh (../shared/GPU.md): the CUDA tests,
# bench.gpu's rows, the served path in process on each CUDA mode, and the fast suite, written
# under $OUT (default ./gpu-run). One prepared call, each step bounded:
#   bash bench/on-gpu.sh     (model_repository/ built here and carried)
set -uo pipefail
out=${OUT:-gpu-run}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/device.csv" 2>&1
python3 -c "import onnxruntime as o; print(o.__version__, o.get_available_providers())" | tee "$out/ort.txt"
timeout 150 python3 -m pytest -q -rs -p no:cacheprovider tests/service/test_cuda.py \
    tests/service/test_runtime.py tests/service/test_binding.py 2>&1 | tail -30 | tee "$out/cuda-tests.txt"
timeout 150 python3 -m bench.gpu --seconds 0.2 --out "$out/gpu.json" 2>&1 | tail -5

# The served path in process (bench/asgi_path.py, V1 predict of one row), c=1 and c=64:
# the CPU (one intra-op thread per session, as served) against CUDA plain, bound, with
# graphs, and bound with TF32 on.
for model in digits-mlp fashion-mlp-wide; do
  mkdir -p "/tmp/plain-$model" "/tmp/graphs-$model"
  cp -r "model_repository/$model" "/tmp/plain-$model/"
  cp -r "model_repository/$model" "/tmp/graphs-$model/"
  echo "optimization { cuda { graphs: true } }" >> "/tmp/graphs-$model/$model/config.pbtxt"
done
serve() {  # MODEL MODE CONCURRENCY REQUESTS [env...]
  local model=$1 mode=$2 c=$3 n=$4; shift 4
  local repo="/tmp/plain-$model"; [ "$mode" = cuda-graphs ] && repo="/tmp/graphs-$model"
  local took
  took=$(env "$@" timeout 60 python3 bench/asgi_path.py "$repo" "$n" "$c" "$model" 2>&1 | tail -1)
  echo "$model $mode c=$c $took" | tee -a "$out/served.txt"
}
for model in digits-mlp fashion-mlp-wide; do
  for c in 1 64; do
    n=$([ "$c" = 1 ] && echo 3000 || echo 12000)
    serve $model cpu $c $n GELU_PROVIDERS=cpu
    serve $model cuda $c $n GELU_PROVIDERS=cuda,cpu GELU_STRICT_PROVIDERS=true GELU_CUDA_IO_BINDING=false
    serve $model cuda-binding $c $n GELU_PROVIDERS=cuda,cpu GELU_STRICT_PROVIDERS=true
    serve $model cuda-graphs $c $n GELU_PROVIDERS=cuda,cpu GELU_STRICT_PROVIDERS=true
    serve $model cuda-tf32 $c $n GELU_PROVIDERS=cuda,cpu GELU_STRICT_PROVIDERS=true GELU_CUDA_TF32=true
  done
done

timeout 170 python3 -m pytest -q -p no:cacheprovider -m "not slow" tests/service tests/contract \
    2>&1 | tail -8 | tee "$out/fast-suite.txt"
