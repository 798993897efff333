#!/bin/bash
# Builds the fa2perf harness for sm_90a (works without a GPU); ptxas reports go to ptxas_*.log.
set -e
cd "$(dirname "$0")"
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
FLAGS="-std=c++17 -O3 -arch=sm_90a -I../../templates -I../../include -I."
ls cfg_*.cu | sed 's/\.cu$//' | xargs -P ${JOBS:-2} -I{} sh -c "$NVCC $FLAGS -Xptxas -v -c {}.cu -o {}.o > ptxas_{}.log 2>&1 || (cat ptxas_{}.log; exit 1)"
$NVCC $FLAGS -Xcompiler -fopenmp -c harness.cu -o harness.o
$NVCC -arch=sm_90a -Xcompiler -fopenmp harness.o cfg_*.o -o harness
