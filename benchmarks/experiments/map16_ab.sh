# int16 against int32 column maps: the old tree (benchmarks/experiments/old) and this one, alternating,
# one tuning DB (the same configs), 2 rounds
export PYTHONUNBUFFERED=1 SPARTUNE_CACHE_DIR=/tmp/sc_map16
for r in 1 2; do
  for t in old new; do
    if [ $t = old ]; then P=$PWD/benchmarks/experiments/old; else P=$PWD; fi
    PYTHONPATH=$P python benchmarks/experiments/map16_probe.py $t 2>&1 | grep '^{'
  done
done
