export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 SPARTUNE_CACHE_DIR=/tmp/sc15
timeout 200 python -m pytest -q -rf -x -m gpu -p no:cacheprovider tests/gpu/test_spmm_nm_gpu.py -k "vnm and not wgmma" > $OUT/t_vnm.log 2>&1
echo "t_vnm: $(tail -1 $OUT/t_vnm.log)"; grep -E "FAILED|Error" $OUT/t_vnm.log | head -5
timeout 300 python benchmarks/bench_nm_decode.py --patterns 64:2:8 64:2:16 128:2:8 --n 1 16 --out $OUT > $OUT/decode_vnm.log 2>&1; echo "decode rc $?"
tail -25 $OUT/decode_vnm.log | cut -c1-160
