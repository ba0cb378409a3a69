export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 SPARTUNE_CACHE_DIR=/tmp/sc19
timeout 300 python benchmarks/bench_nm_decode.py --patterns 64:2:8 --n 1 16 --out $OUT > $OUT/decode.log 2>&1; echo "decode rc $?"
tail -9 $OUT/decode.log | cut -c1-160
python - <<'PY'
import json, os
for r in json.load(open(os.path.join(os.environ["OUT"], "bench_nm_decode_float16.json"))):
    print(r["shape"], r["N"], round(r["tuned_s"] * 1e6, 1), r["tuned_pick"][0][10:100], "| ring", r["ring_config"][7:90])
PY
