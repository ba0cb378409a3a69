export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 SPARTUNE_CACHE_DIR=/tmp/sc21
timeout 240 python -m pytest -q -rf -m gpu -p no:cacheprovider tests/gpu/test_spmm_nm_gpu.py -k "epilogue or graph or linear" > $OUT/t.log 2>&1
echo "t: $(tail -1 $OUT/t.log)"; grep -E "^FAILED" $OUT/t.log | head -5
timeout 120 python benchmarks/experiments/epilogue_cost.py 2>&1 | tail -5
timeout 100 python benchmarks/bench_first_use.py --shape llama13b-up --patterns 2:4 64:2:8 --n 1 16 2048 --out $OUT > $OUT/first_use.log 2>&1; echo "fu rc $?"
tail -8 $OUT/first_use.log
