#!/bin/bash
set -e
cd "$(dirname "$0")"
R=$(cd ../.. && pwd)
g++ -std=c++20 -O2 -I$R -I$R/templates -I/usr/local/cuda/include harness.cpp $R/compiler/splitk_schedule.cpp \
  -L/usr/local/cuda/lib64/stubs -lcuda -lpthread -static-libstdc++ -static-libgcc -o harness
