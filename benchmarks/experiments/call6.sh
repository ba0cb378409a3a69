export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 SPARTUNE_CACHE_DIR=/tmp/sc8
T="timeout 200 python -m pytest -q -rf -m gpu -p no:cacheprovider"
$T tests/gpu/test_csr_smem_gpu.py -k "not across_the_space and not odd_shapes" > $OUT/t_smem.log 2>&1 &
$T tests/gpu/test_spmm_nm_gpu.py -k "every_epilogue or graph" > $OUT/t_nm.log 2>&1 &
wait
echo "t_smem: $(tail -1 $OUT/t_smem.log)"; grep FAILED $OUT/t_smem.log | head
echo "t_nm: $(tail -1 $OUT/t_nm.log)"; grep FAILED $OUT/t_nm.log | head
timeout 300 python benchmarks/bench_csr_decode.py --quick --dtypes float16 --out $OUT > $OUT/csr_decode.log 2>&1; echo "csr rc $?"
tail -14 $OUT/csr_decode.log
