export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 SPARTUNE_CACHE_DIR=/tmp/sc10
timeout 400 python benchmarks/bench_nm_decode.py --patterns 64:2:8 64:2:16 128:2:8 2:4 --n 1 16 --out $OUT > $OUT/decode_vnm.log 2>&1; echo "decode rc $?"
tail -26 $OUT/decode_vnm.log | cut -c1-160
