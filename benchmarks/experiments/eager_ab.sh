# A/B of eager 64:2:8 decode calls: old tree (benchmarks/experiments/old) and this tree, alternating
export PYTHONUNBUFFERED=1 SPARTUNE_CACHE_DIR=/tmp/sc_ab PROFILE=0
for r in 1 2; do
  for t in old new; do
    if [ $t = old ]; then P=$PWD/benchmarks/experiments/old; else P=$PWD; fi
    echo "== $t round $r"; PYTHONPATH=$P python benchmarks/experiments/eager_vnm.py 2>&1 | grep -v -i warn
  done
done
