export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 SPARTUNE_CACHE_DIR=/tmp/sc16
timeout 400 python benchmarks/bench_nm_decode.py --dtype bfloat16 --patterns 64:2:8 2:4 --n 1 16 --out $OUT > $OUT/decode_bf16.log 2>&1; echo "decode rc $?"
tail -17 $OUT/decode_bf16.log | cut -c1-160
