export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 SPARTUNE_CACHE_DIR=/tmp/sc4
S="--shape 11008,4096,1 --shape 11008,4096,16 --shape 11008,4096,2048 --pattern 2:4 --pattern 64:2:8 --pattern 128:2:8 --pattern 64:2:16"
start=$(date +%s.%N)
timeout 150 python -m spartune.cli tune $S --compile-all --no-progress > $OUT/compile_all.log 2>&1; echo "compile-all rc $? $(echo "$(date +%s.%N) - $start" | bc) s"
ls /tmp/sc4/*/ 2>/dev/null | head -2; find /tmp/sc4 -name "*.cubin" | wc -l
for s in llama13b-up llama70b-up llama7b-down; do timeout 60 python benchmarks/experiments/first_use.py --shape $s --patterns 2:4 64:2:8 128:2:8 64:2:16 > $OUT/fu_$s.log 2>&1; echo "fu $s rc $?"; done
SPARTUNE_CACHE_DIR=/tmp/sc5 timeout 100 python benchmarks/experiments/first_use.py --shape llama7b-up --dtype bfloat16 > $OUT/fu_cold_bf16.log 2>&1; echo "fu cold rc $?"
timeout 200 python -m pytest -q -rf -m gpu -p no:cacheprovider tests/gpu/test_cuda_layer_gpu.py tests/gpu/test_cusparselt_gpu.py > $OUT/t_layer.log 2>&1 &
wait
SPARTUNE_CACHE_DIR=/tmp/sc6 timeout 200 python benchmarks/bench_nm_prefill.py --n 2048 --shapes llama7b-up llama7b-down llama13b-up --patterns 2:4 64:2:8 --top 0 --first-use --out $OUT > $OUT/prefill.log 2>&1; echo "prefill rc $?"
echo "t_layer: $(tail -1 $OUT/t_layer.log)"; grep FAILED $OUT/t_layer.log | head
tail -4 $OUT/compile_all.log
for f in fu_llama13b-up fu_llama70b-up fu_llama7b-down fu_cold_bf16; do echo "== $f"; tail -9 $OUT/$f.log; done
tail -16 $OUT/prefill.log
