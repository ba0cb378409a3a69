export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 SPARTUNE_CACHE_DIR=/tmp/sc14
timeout 400 ncu --kernel-name regex:spmm_nm --launch-count 2 --cache-control all --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis python benchmarks/experiments/vnm_ncu.py > $OUT/ncu.txt 2>&1; echo "ncu rc $?"
grep -E "spmm_nm|Duration|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Warp Cycles Per Issued|Shared Memory Config|Grid Size|L2 Hit|Mem Busy|Max Bandwidth|Waves" $OUT/ncu.txt | head -60
