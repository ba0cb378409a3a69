export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 SPARTUNE_CACHE_DIR=/tmp/sc7
timeout 200 python -m pytest -q -rf -m gpu -p no:cacheprovider tests/gpu/test_spmm_nm_gpu.py -k "not vnm and not wgmma" > $OUT/t_nm.log 2>&1
echo "t_nm: $(tail -1 $OUT/t_nm.log)"; grep FAILED $OUT/t_nm.log | head
timeout 300 python benchmarks/bench_nm_decode.py --n 16 1 --out $OUT > $OUT/decode.log 2>&1; echo "decode rc $?"
timeout 60 python benchmarks/bench_first_use.py --shape llama13b-up --out $OUT > $OUT/first_use.log 2>&1; echo "fu rc $?"
tail -6 $OUT/first_use.log
tail -10 $OUT/decode.log
