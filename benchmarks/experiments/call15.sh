export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 SPARTUNE_CACHE_DIR=/tmp/sc18
timeout 200 python benchmarks/experiments/copy_cost.py 2>&1 | tail -8
