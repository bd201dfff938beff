#!/usr/bin/env bash
# On a lent GPU machine, after ../shared/gpu/unpack.sh (../shared/GPU.md): the CUDA tests,
# bench.gpu's rows, the served path in process on each CUDA mode, and the fast suite, written
# under $OUT (default ./gpu-run). One prepared call, each step bounded:
#   bash bench/on-gpu.sh [STEP...]     (tests graphs gpu served suite; default all; model_repository/
#                                       built here and carried)
set -uo pipefail
out=${OUT:-gpu-run}
steps=${*:-tests graphs gpu served suite}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/device.csv" 2>&1
python3 -c "import onnxruntime as o; print(o.__version__, o.get_available_providers())" | tee "$out/ort.txt"
if [[ " $steps " == *" tests "* ]]; then
  timeout 150 python3 -m pytest -q -rs -p no:cacheprovider tests/service/test_cuda.py \
      tests/service/test_onnxrt.py tests/service/test_binding.py \
      tests/service/test_batching_invariance.py 2>&1 | tail -30 | tee "$out/cuda-tests.txt"
fi
if [[ " $steps " == *" graphs "* ]]; then  # judged afterwards: python -m bench.cuda_graphs --judge
  timeout 200 python3 -m bench.cuda_graphs --out "$out/cuda-graphs.npz" 2>&1 \
      | tee "$out/cuda-graphs.json"
fi
if [[ " $steps " == *" gpu "* ]]; then
  timeout 150 python3 -m bench.gpu --seconds 0.2 --out "$out/gpu.json" 2>&1 | tail -5
fi

# The served path in process (bench/asgi_path.py, V1 predict of one row), c=1 and c=64: the
# CPU (one intra-op thread per session, as served) against CUDA's plain run, I/O binding, two
# instances, graphs (with two instances), and TF32 on.
variant() {  # NAME CONFIG_LINE: a repository of each model with CONFIG_LINE appended
  for model in digits-mlp fashion-mlp-wide; do
    mkdir -p "/tmp/$1-$model"
    cp -r "model_repository/$model" "/tmp/$1-$model/"
    echo "$2" >> "/tmp/$1-$model/$model/config.pbtxt"
  done
}
serve() {  # MODEL MODE REPOSITORY CONCURRENCY REQUESTS [env...]
  local model=$1 mode=$2 repo=$3-$1 c=$4 n=$5; shift 5
  local took
  took=$(env "$@" timeout 60 python3 bench/asgi_path.py "/tmp/$repo" "$n" "$c" "$model" 2>&1 | tail -1)
  echo "$model $mode c=$c $took" | tee -a "$out/served.txt"
}
if [[ " $steps " == *" served "* ]]; then
  variant plain ""
  variant two "instance_group [ { kind: KIND_GPU count: 2 } ]"
  variant graphs "instance_group [ { kind: KIND_GPU count: 2 } ] optimization { cuda { graphs: true } }"
  cuda="GELU_PROVIDERS=cuda,cpu GELU_STRICT_PROVIDERS=true"
  for model in digits-mlp fashion-mlp-wide; do
    for c in 1 64; do
      n=$([ "$c" = 1 ] && echo 3000 || echo 12000)
      serve $model cpu plain $c $n GELU_PROVIDERS=cpu
      serve $model cuda plain $c $n $cuda
      serve $model cuda-binding plain $c $n $cuda GELU_CUDA_IO_BINDING=true
      serve $model cuda-2-instances two $c $n $cuda
      serve $model cuda-graphs graphs $c $n $cuda
      serve $model cuda-tf32 plain $c $n $cuda GELU_CUDA_TF32=true
    done
  done
fi

if [[ " $steps " == *" suite "* ]]; then
  timeout 170 python3 -m pytest -q -p no:cacheprovider -m "not slow" tests/service tests/contract \
      2>&1 | tail -8 | tee "$out/fast-suite.txt"
fi
