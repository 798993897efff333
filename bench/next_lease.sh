#!/usr/bin/env bash
# The next device lease's calls (sessions 30-31 had no GPU; perf-notes "For the next session").
# Here first: `bash scripts/pack-device.sh` and `bash scripts/make-mlir-parity.sh` (build-device/,
# ~40 MB); then run(command="bash bench/next_lease.sh $OUT [MODE]", carry=["build-device"]), one call
# per mode, each well under the 600 s a call may take:
#  (none) ~450 s: the whole GPU suite with the MLIR parity check (sessions 30-31's kernels have never
#         run on a GPU: the gather's pass and its 64-bit branch, pages 1 GiB and 2 GiB apart, deeper
#         rings on every path, gather_noinc, fa2's paged stream in both backends), then the gather's
#         A/Bs at one key a page. Predictions (run 31c: d64 chunked gather 111 / fa2 107 / contiguous
#         256; d128 causal gather 232 / contiguous 652): the new pass d64 130-150, d128 250-280;
#         gather_noinc d64 140-170 and d128 260-300 if the fenced publication's MEMBAR waits for every
#         copy, else +0..5%.
#  ab     ~350 s: deeper rings (+10..30% if the copies' latency binds); 16-key pages gathered against
#         boxes; fa2's paged stream (+20..50% on run 31b's 197 / 185); unmasked d128 16-key pages with
#         three warpgroups or stages; the d192/d96 whole-page tiles against their old key blocks; the
#         stages sweep on causal S1024 (bench/ab_lists/session30_stages.txt).
#  ncu    ~320 s: Nsight Compute of d128 S4096, DRAM bytes and SM clock with L2 sections of 2 pairs
#         against the default 8, then the stall-by-SASS-line table (NCU_SOURCE=1).
# Files under $OUT (at most 8 come back): times.txt, ab.txt, gpu-check.txt and gpu-check's own
# (info.txt, gpu-tests.log, cli-check.txt, mlir-parity.txt); ncu-sections.txt and the ncu tables.
set -u
O=$1
mode=${2:-tests}
mkdir -p "$O"
export LD_LIBRARY_PATH=$PWD/build-device FLASHJIT_CACHE_DIR=/tmp/fjc FLASHJIT_BUILD_DIR=build-device
cli=build-device/flashjit
t0=$(date +%s)
stamp() { echo "$1 $(($(date +%s) - t0)) s" >>"$O/times.txt"; }
# A build-device/ from before session 31 knows neither the tuning nor the tests: stop, don't time it.
if ! grep -q gather_noinc build-device/libflashjit.so ||
  ! build-device/tests/flashjit_gpu_tests --gtest_list_tests | grep -q GatherNoincGivesTheFencedBits; then
  echo "stale build-device/: run scripts/pack-device.sh first" >>"$O/times.txt"
  exit 1
fi
run() { # label tuning args...
  local label="$1" tuning="$2"
  shift 2
  local line
  line=$(FLASHJIT_FA3_TUNING="$tuning" timeout 25 $cli bench -n 40 "$@" 2>&1 | grep -E "^(kernel|median)" | tr '\n' ' ')
  echo "$label [$tuning]: ${line:-failed}" >>"$O/ab.txt"
}
d64=(-b 8 -s 1024 --seqlen-k 16384 --heads-q 32 --heads-kv 8 -d 64 --causal)
d128=(-b 4 -s 4096 --heads-q 32 --heads-kv 8 -d 128 --causal)
case $mode in
tests)
  # Eight shards on the 16 cores (six took 200 s for the longest in run 32b, before this session added
  # four GPU tests), each stopped after 300 s.
  timeout 390 bash scripts/gpu-check.sh "$O" --test-jobs=8 --test-timeout=300 >"$O/gpu-check.txt" 2>&1
  stamp tests
  run "d64 chunked gather page1" "" "${d64[@]}" --page-size 1 --variant fa3 --strict
  run "d64 chunked gather page1 noinc" "gather_noinc=1" "${d64[@]}" --page-size 1 --variant fa3 --strict
  run "d64 chunked fa3 contiguous" "" "${d64[@]}" --variant fa3
  run "d64 chunked fa2 page1" "" "${d64[@]}" --page-size 1 --variant fa2
  run "d128 causal gather page1" "" "${d128[@]}" --page-size 1 --variant fa3 --strict
  run "d128 causal gather page1 noinc" "gather_noinc=1" "${d128[@]}" --page-size 1 --variant fa3 --strict
  run "d128 causal fa3 contiguous" "" "${d128[@]}" --variant fa3
  stamp gather
  ;;
ab)
  run "d64 chunked gather page1 s3" "stages=3" "${d64[@]}" --page-size 1 --variant fa3 --strict
  run "d64 chunked gather page1 noinc s3" "gather_noinc=1,stages=3" "${d64[@]}" --page-size 1 --variant fa3 --strict
  run "d128 causal gather page1 s3" "stages=3" "${d128[@]}" --page-size 1 --variant fa3 --strict
  run "d64 chunked boxes page16" "" "${d64[@]}" --page-size 16 --variant fa3 --strict
  run "d64 chunked gather page16 noinc" "paged_gather=1,gather_noinc=1" "${d64[@]}" --page-size 16 --variant fa3 --strict
  run "d128 causal boxes page16" "" "${d128[@]}" --page-size 16 --variant fa3 --strict
  run "d128 causal gather page16 noinc" "paged_gather=1,gather_noinc=1" "${d128[@]}" --page-size 16 --variant fa3 --strict
  run "d128 causal gather page16" "paged_gather=1" "${d128[@]}" --page-size 16 --variant fa3 --strict
  stamp gather-ab
  # fa2's paged stream (run 31b: 4x4096 causal fa2 page 16 197, page 1 185; d64 chunked page 16 107).
  run "d128 causal fa2 page16" "" "${d128[@]}" --page-size 16 --variant fa2
  run "d128 causal fa2 page1" "" "${d128[@]}" --page-size 1 --variant fa2
  run "d64 chunked fa2 page16" "" "${d64[@]}" --page-size 16 --variant fa2
  stamp fa2-paged
  # 16-key pages in boxes, unmasked d128 (run 31c: N160 565, contiguous 695): fewer boxes per query
  # with three warpgroups (M192 N80: a third fewer per unit of work), a deeper ring, or gathered.
  u128=(-b 4 -s 4096 --heads-q 16 -d 128 --variant fa3 --strict --page-size 16)
  run "u128 page16 default" "" "${u128[@]}"
  run "u128 page16 3wg" "consumer_warpgroups=3" "${u128[@]}"
  run "u128 page16 s3" "stages=3" "${u128[@]}"
  run "u128 page16 gather noinc" "paged_gather=1,gather_noinc=1" "${u128[@]}"
  c192=(-b 2 -s 4096 --heads-q 12 --heads-kv 4 -d 192 --causal --variant fa3 --strict --page-size 64)
  u192=(-b 2 -s 4096 --heads-q 12 -d 192 --variant fa3 --strict --page-size 64)
  u96=(-b 2 -s 4096 --heads-q 24 --heads-kv 8 -d 96 --variant fa3 --strict --page-size 64)
  run "u192 page64 new" "" "${u192[@]}"
  run "u192 page64 n112" "block_n=112" "${u192[@]}"
  run "c192 page64 new" "" "${c192[@]}"
  run "c192 page64 n112" "block_n=112" "${c192[@]}"
  run "u96 page64 new" "" "${u96[@]}"
  run "u96 page64 n96" "block_n=96" "${u96[@]}"
  stamp whole-page
  timeout 100 python3 bench/sweep.py --lib build-device/libflashjit.so --dtypes bf16 --out /tmp/st.json \
    bench/ab_lists/session30_stages.txt >>"$O/ab.txt" 2>&1
  stamp stages-sweep
  ;;
ncu)
  for sp in 0 2; do
    FLASHJIT_FA3_TUNING=$([ $sp = 0 ] || echo section_pairs=$sp) timeout 70 bash bench/ncu_profile.sh /tmp/ncu$sp fa3_d128 2>&1 |
      grep -E "Duration|DRAM Throughput|L2 Hit|SM Frequency|TFLOP|Elapsed Cycles" |
      sed "s/^/sections of $sp pairs (0: the default 8): /" >>"$O/ncu-sections.txt"
  done
  stamp ncu-sections
  NCU_SOURCE=1 timeout 170 bash bench/ncu_profile.sh "$O" fa3_d128 >/dev/null 2>&1
  stamp ncu-source
  ;;
*)
  echo "mode: (none) | ab | ncu" >&2
  exit 2
  ;;
esac
