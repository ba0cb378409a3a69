#!/usr/bin/env bash
# Everything that needs the GPU, in one call: GPU tests, then the benchmarks (table last).
#   bash scripts/gpu.sh [benchmark args...]     (on the GPU machine; results under $OUT)
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"; export OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
python -m pytest -q -x ${GPU_TESTS:-tests/gpu} -m gpu -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log" | tail -15
for b in ${BENCHES:-bench_blocked}; do
  python "benchmarks/$b.py" "$@" 2>&1 | tee "$OUT/$b.log" | grep -v '^{' 
done
