export PYTHONPATH=$PWD:$PWD/benchmarks PYTHONUNBUFFERED=1 SPARTUNE_CACHE_DIR=/tmp/sc19
run() { tag=$1; shift
  timeout 150 ncu --clock-control none --cache-control all --kernel-name spmm_csr_smem --launch-skip 1 -c 1 \
    --section SpeedOfLight --section WarpStateStats --section SourceCounters --section Occupancy --section LaunchStats \
    --section SchedulerStats --section MemoryWorkloadAnalysis -o $OUT/$tag python benchmarks/experiments/csr_ncu.py "$@" > $OUT/$tag.log 2>&1
  ncu --import $OUT/$tag.ncu-rep --page details > $OUT/$tag.txt 2>&1
  ncu --import $OUT/$tag.ncu-rep --page source --csv --print-source sass > $OUT/$tag.sass.csv 2>&1 || echo "no source page"
  grep -E "Duration|Issued Ipc|No Eligible|Registers Per|Achieved Occupancy|DRAM Throughput|L1/TEX Hit|Block Limit" $OUT/$tag.txt | head -20
}
run whole16 4096 4096 16 16 4096 32 1 1 16 1
run ck8_16 4096 4096 16 16 512 8 1 1 1 8
