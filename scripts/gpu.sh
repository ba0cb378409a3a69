#!/usr/bin/env bash
# What needs the GPU, in one device call each (a call may run 10 minutes): the GPU tests, then
# benchmark runs, each writing its full results under $OUT.
#   bash scripts/gpu.sh                     # the GPU tests (~8 min, eleven processes)
#   TESTS=0 bash scripts/gpu.sh             # the quick CSR and block benches (~3 min)
#   TESTS=0 RUNS="eval_tuner.py --budget-s 330" bash scripts/gpu.sh     # the tuner evaluation (~3 min)
#   TESTS=0 RUNS="eval_tuner.py --suite nm --budget-s 330" bash scripts/gpu.sh   # the same on 2:4 / V:N:M (issue 14)
#   TESTS=0 RUNS="bench_blocked.py --quick" bash scripts/gpu.sh     # ";"-separated benchmark runs
#   TESTS=0 RUNS="bench_csr_decode.py --quick --dtypes float16" bash scripts/gpu.sh   # CSR decode (issue 16)
#   TESTS=0 RUNS="bench_nm_decode.py --n 1 16" bash scripts/gpu.sh       # 2:4 decode, every mma config (issue 14)
#   TESTS=0 RUNS="bench_nm_decode.py --patterns 64:2:8 64:2:16" bash scripts/gpu.sh   # V:N:M decode
#   TESTS=0 RUNS="bench_nm_prefill.py --n 2048 --no-tuned" bash scripts/gpu.sh   # 2:4 and V:N:M prefill (issue 14)
#   TESTS=0 RUNS="bench_first_use.py --shape llama13b-up" bash scripts/gpu.sh   # first use of a shape (tuning time)
#   TESTS=0 RUNS="bench_blocked.py --shfl --heights 32,64" bash scripts/gpu.sh   # Shfl-BW beside block (issue 17)
#   TESTS=0 RUNS="spartune bench --suite e2e --quick --filter bert --filter decode" bash scripts/gpu.sh  # models
# A device call stops at 600 s: tests (TEST_S, default 480 each, in parallel; eleven processes share
# 16 cores, and 360 s cut two of them in session 19) plus the runs
# (RUN_S, default 400 each) must fit; each run's own budget must stay below RUN_S.
# SPARTUNE_CACHE_DIR keeps the tuning DB away from platformdirs (not installed there).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 SPARTUNE_CACHE_DIR=${SPARTUNE_CACHE_DIR:-/tmp/spartune-cache}
export SPARTUNE_GPU_TESTS=1  # tests/conftest.py: compiled kernels, the gpu-marked tests run
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"; export OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
# the GPU tests compile hundreds of kernels: several processes at once (about 4 minutes; one
# process took over 7)
gpu_tests() {  # $1: log name, then pytest's selection
  local log=$1; shift
  timeout "${TEST_S:-480}" python -m pytest -q -rf -m gpu -p no:cacheprovider "$@" > "$OUT/$log" 2>&1
}
if [ "${TESTS:-1}" = 1 ]; then
  gpu_tests gpu_tests_blocked.log tests/gpu/test_blocked_gpu.py tests/gpu/test_cuda_layer_gpu.py tests/gpu/test_hf_generate_gpu.py & p1=$!
  # (torch integration alone ran 350 s in session 41: with the blocked tests it passed TEST_S)
  gpu_tests gpu_tests_torch.log tests/gpu/test_torch_integration_gpu.py tests/gpu/test_memory_policy_gpu.py & p11=$!
  gpu_tests gpu_tests_csr1.log tests/gpu/test_csr_gpu.py -k "spmm_every_config" & p2=$!
  gpu_tests gpu_tests_csr2.log tests/gpu/test_csr_gpu.py -k "not spmm_every_config and not benchmark_shapes" & p3=$!
  gpu_tests gpu_tests_csr3.log tests/gpu/test_csr_gpu.py -k "benchmark_shapes" & p4=$!
  # (-k selects in every file named: cuSPARSELt's tests go with the first)
  gpu_tests gpu_tests_nm.log tests/gpu/test_spmm_nm_gpu.py -k "not vnm and not decode_clusters" tests/gpu/test_cusparselt_gpu.py & p5=$!
  gpu_tests gpu_tests_nm2.log tests/gpu/test_spmm_nm_gpu.py -k "decode_clusters" & p9=$!
  gpu_tests gpu_tests_vnm.log tests/gpu/test_spmm_nm_gpu.py -k "vnm" & p6=$!
  # csr_smem compiles ~400 instances: three processes of ~3-5 minutes each
  gpu_tests gpu_tests_smem1.log tests/gpu/test_csr_smem_gpu.py -k "across_the_space" & p7=$!
  # (the rest took 480 s alone in one process on a cold machine in session 20: split by test)
  gpu_tests gpu_tests_smem2.log tests/gpu/test_csr_smem_gpu.py -k "clusters or odd_shapes" & p8=$!
  gpu_tests gpu_tests_smem3.log tests/gpu/test_csr_smem_gpu.py -k "not across_the_space and not clusters and not odd_shapes" & p10=$!
  for p in $p1 $p2 $p3 $p4 $p5 $p6 $p7 $p8 $p9 $p10 $p11; do wait "$p" || echo "a test process exited with $? (124: timed out)"; done
  for f in "$OUT"/gpu_tests_*.log; do echo "$f: $(grep -E 'passed|failed|error' "$f" | tail -1)"; done
fi
quick="bench_csr.py --quick --budget-s 90;bench_blocked.py --quick --max-configs 14"
[ "${TESTS:-1}" = 1 ] && quick=""  # tests and benches do not fit one call together
IFS=';' read -ra runs <<< "${RUNS-$quick}"
for run in "${runs[@]}"; do
  name=$(echo "$run" | awk '{print $1}' | sed 's/\.py$//')
  base=$name; i=2; while [ -e "$OUT/$name.log" ]; do name=$base-$i; i=$((i + 1)); done  # a script run twice keeps both logs
  echo "== $run"
  if [[ $run == spartune* ]]; then  # the command line itself (e2e), its results in $OUT/spartune-bench
    # (eval: a quoted argument such as --filter "decode N=1" stays one word)
    eval "timeout ${RUN_S:-400} python -m spartune.cli ${run#spartune } --out \"\$OUT/spartune-bench\"" > "$OUT/$name.log" 2>&1
  else
    eval "timeout ${RUN_S:-400} python benchmarks/$run" > "$OUT/$name.log" 2>&1
  fi
  tail -14 "$OUT/$name.log"
done
