export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 SPARTUNE_CACHE_DIR=/tmp/sc17
T="timeout 250 python -m pytest -q -rf -m gpu -p no:cacheprovider"
$T tests/gpu/test_spmm_nm_gpu.py -k "linear or graph" tests/gpu/test_cuda_layer_gpu.py tests/gpu/test_cusparselt_gpu.py > $OUT/t1.log 2>&1 &
$T tests/gpu/test_csr_smem_gpu.py -k "through_spartune_linear" tests/gpu/test_blocked_gpu.py -k "linear" > $OUT/t2.log 2>&1 &
wait
for f in t1 t2; do echo "$f: $(tail -1 $OUT/$f.log)"; grep -E "^FAILED" $OUT/$f.log | head -5; done
timeout 100 python benchmarks/bench_first_use.py --shape llama13b-up --patterns 2:4 64:2:8 --n 1 16 2048 --out $OUT > $OUT/first_use.log 2>&1; echo "fu rc $?"
tail -8 $OUT/first_use.log
