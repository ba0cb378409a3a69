export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 SPARTUNE_CACHE_DIR=/tmp/sc
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 100 python benchmarks/experiments/first_use.py --shape llama7b-up > $OUT/fu1.log 2>&1; echo fu1 rc $?
timeout 60 python benchmarks/experiments/first_use.py --shape llama13b-up > $OUT/fu2.log 2>&1; echo fu2 rc $?
timeout 80 python benchmarks/experiments/first_use.py --shape llama7b-down --dtype bfloat16 > $OUT/fu3.log 2>&1; echo fu3 rc $?
T="timeout 250 python -m pytest -q -rf -m gpu -p no:cacheprovider"
$T tests/gpu/test_spmm_nm_gpu.py -k "not vnm" tests/gpu/test_cuda_layer_gpu.py > $OUT/t_nm.log 2>&1 &
$T tests/gpu/test_spmm_nm_gpu.py -k "vnm" > $OUT/t_vnm.log 2>&1 &
$T tests/gpu/test_csr_smem_gpu.py -k "through_spartune_linear or graph or epilogue" > $OUT/t_smem.log 2>&1 &
wait
timeout 170 python benchmarks/bench_nm_decode.py --shapes llama7b-up llama13b-up --n 1 16 --out $OUT > $OUT/decode.log 2>&1; echo decode rc $?
for f in t_nm t_vnm t_smem; do echo "$f: $(tail -1 $OUT/$f.log)"; grep -E "^FAILED" $OUT/$f.log | head -5; done
for f in fu1 fu2 fu3; do tail -6 $OUT/$f.log; done
tail -8 $OUT/decode.log
