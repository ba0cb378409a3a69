export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 SPARTUNE_CACHE_DIR=/tmp/sc3
timeout 100 python benchmarks/experiments/first_use.py --shape llama7b-up > $OUT/fu1.log 2>&1; echo fu1 rc $?
timeout 60 python benchmarks/experiments/first_use.py --shape llama13b-up > $OUT/fu2.log 2>&1; echo fu2 rc $?
timeout 80 python benchmarks/experiments/first_use.py --shape llama7b-down --dtype bfloat16 > $OUT/fu3.log 2>&1; echo fu3 rc $?
timeout 60 python benchmarks/experiments/first_use.py --shape llama70b-up > $OUT/fu4.log 2>&1; echo fu4 rc $?
for f in fu1 fu2 fu3 fu4; do tail -6 $OUT/$f.log; done
