#!/bin/bash
set -e
cd "$(dirname "$0")"
R=/work/main
g++ -std=c++20 -O1 -DFLASHJIT_SOURCE_DIR=\"$R\" -I$R -I$R/include -I$R/templates -I/usr/local/cuda/include \
  gen.cpp $R/compiler/plan.cpp $R/compiler/spec.cpp $R/compiler/codegen.cpp $R/compiler/plans/decode_plan.cpp \
  -L/usr/local/cuda/lib64 -lnvrtc -lxxhash -Wl,-rpath,/usr/local/cuda/lib64 -o gen
