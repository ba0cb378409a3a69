#!/usr/bin/env bash
# the A/B driver: old and new trees in turns, two rounds each
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 SPARTUNE_CACHE_DIR=/tmp/sc_ab
for r in 1 2; do
  PYTHONPATH=$PWD/benchmarks/experiments/old python benchmarks/experiments/pack_ab.py old ${MAX_N:-99999} ${MIN_N:-0} >> "$OUT/pack_ab.jsonl" 2> "$OUT/pack_ab_old.err"
  PYTHONPATH=$PWD python benchmarks/experiments/pack_ab.py new ${MAX_N:-99999} ${MIN_N:-0} >> "$OUT/pack_ab.jsonl" 2> "$OUT/pack_ab_new.err"
done
python - "$OUT/pack_ab.jsonl" <<'PY'
import json, sys, collections
rows = [json.loads(l) for l in open(sys.argv[1])]
by = collections.defaultdict(lambda: collections.defaultdict(list))
for r in rows:
    if "ours_us" in r:
        by[(r["case"], r["config"])][r["tree"]].append((r["ours_us"], r["x_dense"], r["rel_err"]))
    else:
        print(r)
for (case, cfg), t in by.items():
    o, n = t.get("old", []), t.get("new", [])
    f = lambda v: " ".join(f"{a:.1f}" for a, _, _ in v)
    print(f"{case:24s} old {f(o):16s} new {f(n):16s} x_dense new {' '.join(str(b) for _, b, _ in n)} err {max([e for *_, e in n] or [0]):.1e}  {cfg[:60]}")
PY
