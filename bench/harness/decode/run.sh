#!/bin/bash
# Device run: correctness + bandwidth. Logs to $OUT.
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $OUT/gpu.txt 2>&1
timeout 200 ./harness cubins_h all > $OUT/harness.log 2>&1
echo "rc=$?" >> $OUT/harness.log
tail -c 11000 $OUT/harness.log
