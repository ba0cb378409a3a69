#!/usr/bin/env bash
# Everything that needs the GPU, in one device call (about 9 minutes): the GPU tests, then the
# kernel benchmarks and the tuner evaluation, each writing its full results under $OUT.
#   bash scripts/gpu.sh                     # the default set below
#   RUNS="bench_blocked.py --quick" bash scripts/gpu.sh     # ';'-separated benchmark runs
# SPARTUNE_CACHE_DIR keeps the tuning DB away from platformdirs (not installed there).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 SPARTUNE_CACHE_DIR=${SPARTUNE_CACHE_DIR:-/tmp/spartune-cache}
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"; export OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
timeout "${TEST_S:-150}" python -m pytest -q -rf tests/gpu -m gpu -p no:cacheprovider 2>&1 \
  | grep -v -i warn > "$OUT/gpu_tests.log"; tail -5 "$OUT/gpu_tests.log"
IFS=';' read -ra runs <<< "${RUNS:-eval_tuner.py --budget-s 150;bench_csr.py --quick --budget-s 90;bench_blocked.py --quick --max-configs 14}"
for run in "${runs[@]}"; do
  name=$(echo "$run" | awk '{print $1}' | sed 's/\.py$//')
  echo "== $run"
  # shellcheck disable=SC2086
  timeout 300 python benchmarks/$run > "$OUT/$name.log" 2>&1; tail -14 "$OUT/$name.log"
done
