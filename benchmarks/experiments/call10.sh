export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 SPARTUNE_CACHE_DIR=/tmp/sc12
T="timeout 330 python -m pytest -q -rf -m gpu -p no:cacheprovider"
$T tests/gpu/test_spmm_nm_gpu.py -k "not vnm" > $OUT/t_nm.log 2>&1 &
$T tests/gpu/test_spmm_nm_gpu.py -k "vnm" > $OUT/t_vnm.log 2>&1 &
$T tests/gpu/test_torch_integration_gpu.py tests/gpu/test_cuda_layer_gpu.py tests/gpu/test_cusparselt_gpu.py > $OUT/t_int.log 2>&1 &
wait
for f in t_nm t_vnm t_int; do echo "$f: $(tail -1 $OUT/$f.log)"; grep -E "^FAILED" $OUT/$f.log | head -5; done
SPARTUNE_CACHE_DIR=/tmp/sc13 timeout 100 python benchmarks/bench_first_use.py --shape llama13b-up --patterns 2:4 64:2:8 128:2:8 --n 1 16 2048 --out $OUT > $OUT/first_use_cold.log 2>&1; echo "fu rc $?"
tail -11 $OUT/first_use_cold.log
