export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 SPARTUNE_CACHE_DIR=/tmp/sc
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 python benchmarks/experiments/first_use.py --shape llama7b-up > $OUT/fu1.log 2>&1; echo fu1 rc $?
timeout 100 python benchmarks/experiments/first_use.py --shape llama13b-up > $OUT/fu2.log 2>&1; echo fu2 rc $?
timeout 100 python benchmarks/experiments/first_use.py --shape llama7b-down --dtype bfloat16 > $OUT/fu3.log 2>&1; echo fu3 rc $?
timeout 220 python -m pytest -q -rf -m gpu -p no:cacheprovider tests/gpu/test_spmm_nm_gpu.py -k "graph or every_epilogue" > $OUT/t_nm.log 2>&1 &
timeout 220 python -m pytest -q -rf -m gpu -p no:cacheprovider tests/gpu/test_csr_smem_gpu.py -k "graph or every_epilogue or strided or empty" > $OUT/t_smem.log 2>&1 &
wait
tail -3 $OUT/t_nm.log $OUT/t_smem.log
for f in fu1 fu2 fu3; do tail -7 $OUT/$f.log; done
