export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 SPARTUNE_CACHE_DIR=/tmp/sc20
timeout 200 python benchmarks/experiments/epilogue_cost.py 2>&1 | tail -6
