#!/usr/bin/env bash
# The next device lease's calls (sessions 30-31 had no GPU; perf-notes "For the next session").
# Here first: `bash scripts/pack-device.sh` and `bash scripts/make-mlir-parity.sh` (build-device/,
# ~40 MB); then run(command="bash bench/next_lease.sh $OUT", carry=["build-device"], timeout 600).
# Run 1 (`bench/next_lease.sh $OUT`):
#  - the whole GPU suite with the MLIR parity check: sessions 30-31's kernels (the gather's pass and
#    its 64-bit branch, pages 1 GiB and 2 GiB apart, deeper rings on every path, gather_noinc, fa2's
#    paged stream in both backends) have never run on a GPU;
#  - the gather against fa2 and contiguous fa3 (run 31c: d64 chunked 111 / fa2 107 / contiguous 256;
#    d128 causal page 1 232 / contiguous 652); predictions: d64 130-150, d128 250-280; deeper rings
#    +10..30% if the copies' latency binds; fa2 paged +20..50%; gather_noinc d64 140-170 and d128
#    260-300 if the publication's MEMBAR waits for every copy, else +0..5%.
# Run 2 (`bench/next_lease.sh $OUT ncu`):
#  - 16-key pages in boxes with three warpgroups or three stages; the whole-page tiles picked by
#    extension (d192 pages of 64: N64 against N112; d96: N64 against N96);
#  - bench/ab_lists/session30_stages.txt (deeper rings on causal S1024);
#  - Nsight Compute, d128 S4096: DRAM bytes and SM clock with L2 sections of 2 pairs against the
#    default 8, then the stall-by-SASS-line table (NCU_SOURCE=1).
# Files under $OUT (at most 8 come back): times.txt, ab.txt, gpu-check.txt and gpu-check's own
# (info.txt, gpu-tests.log, cli-check.txt, mlir-parity.txt), ncu-sections.txt, the ncu tables.
set -u
O=$1; mkdir -p $O
export LD_LIBRARY_PATH=$PWD/build-device FLASHJIT_CACHE_DIR=/tmp/fjc FLASHJIT_BUILD_DIR=build-device
cli=build-device/flashjit
t0=$(date +%s)
stamp() { echo "$1 $(( $(date +%s)-t0 )) s" >> $O/times.txt; }
if [ "${2:-}" != ncu ]; then
# The whole suite: every fa3 kernel's template changed (smem.cuh's swizzle constants, SASS unchanged
# for the unpaged kernels compared here) and the gather's pass is new.
# Files: info.txt, gpu-tests.log, cli-check.txt (gpu-check's), gpu-check.txt, times.txt, ab.txt.
# (run `bash scripts/make-mlir-parity.sh` here first: fa2's paged stream changed in both backends, and
# the parity check compares them bit for bit; gpu-check adds mlir-parity.txt.)
timeout 330 bash scripts/gpu-check.sh $O --test-timeout=250 > $O/gpu-check.txt 2>&1
stamp tests
run() { # label tuning args...
  local label="$1" tuning="$2"; shift 2
  local line
  line=$(FLASHJIT_FA3_TUNING="$tuning" timeout 30 $cli bench -n 40 "$@" 2>&1 | grep -E "^(kernel|median)" | tr '\n' ' ')
  echo "$label [$tuning]: ${line:-failed}" >> $O/ab.txt
}
d64=(-b 8 -s 1024 --seqlen-k 16384 --heads-q 32 --heads-kv 8 -d 64 --causal)
d128=(-b 4 -s 4096 --heads-q 32 --heads-kv 8 -d 128 --causal)
run "d64 chunked fa3 contiguous" "" "${d64[@]}" --variant fa3
run "d64 chunked gather page1" "" "${d64[@]}" --page-size 1 --variant fa3 --strict
run "d64 chunked fa2 page1" "" "${d64[@]}" --page-size 1 --variant fa2
run "d64 chunked gather page1 s3" "stages=3" "${d64[@]}" --page-size 1 --variant fa3 --strict
run "d64 chunked gather page1 s4" "stages=4" "${d64[@]}" --page-size 1 --variant fa3 --strict
run "d64 chunked gather page1 noinc" "gather_noinc=1" "${d64[@]}" --page-size 1 --variant fa3 --strict
run "d64 chunked gather page1 noinc s3" "gather_noinc=1,stages=3" "${d64[@]}" --page-size 1 --variant fa3 --strict
run "d64 chunked gather page16 forced" "paged_gather=1" "${d64[@]}" --page-size 16 --variant fa3 --strict
run "d64 chunked gather page16 forced noinc" "paged_gather=1,gather_noinc=1" "${d64[@]}" --page-size 16 --variant fa3 --strict
run "d64 chunked boxes page16" "" "${d64[@]}" --page-size 16 --variant fa3 --strict
run "d128 causal gather page1" "" "${d128[@]}" --page-size 1 --variant fa3 --strict
run "d128 causal fa3 contiguous" "" "${d128[@]}" --variant fa3
run "d128 causal gather page1 s3" "stages=3" "${d128[@]}" --page-size 1 --variant fa3 --strict
run "d128 causal gather page1 noinc" "gather_noinc=1" "${d128[@]}" --page-size 1 --variant fa3 --strict
run "d128 causal gather page16 forced noinc" "paged_gather=1,gather_noinc=1" "${d128[@]}" --page-size 16 --variant fa3 --strict
run "d128 causal gather page16 forced" "paged_gather=1" "${d128[@]}" --page-size 16 --variant fa3 --strict
run "d128 causal boxes page16" "" "${d128[@]}" --page-size 16 --variant fa3 --strict
# fa2's paged stream (run 31b: 4x4096 causal fa2 page 16 197, page 1 185; d64 chunked page 16 107):
run "d128 causal fa2 contiguous" "" "${d128[@]}" --variant fa2
run "d128 causal fa2 page16" "" "${d128[@]}" --page-size 16 --variant fa2
run "d128 causal fa2 page1" "" "${d128[@]}" --page-size 1 --variant fa2
run "d64 chunked fa2 page16" "" "${d64[@]}" --page-size 16 --variant fa2
stamp gather
exit 0
fi
# Run 2 (`bench/next_lease.sh $OUT ncu`):
run() { # label tuning args...
  local label="$1" tuning="$2"; shift 2
  local line
  line=$(FLASHJIT_FA3_TUNING="$tuning" timeout 30 $cli bench -n 40 "$@" 2>&1 | grep -E "^(kernel|median)" | tr '\n' ' ')
  echo "$label [$tuning]: ${line:-failed}" >> $O/ab.txt
}
# 16-key pages in boxes, unmasked d128 (run 31c: N160 565, contiguous 695): fewer boxes per query
# with three warpgroups (M192 N80: a third fewer per unit of work), and a deeper ring.
u128=(-b 4 -s 4096 --heads-q 16 -d 128 --variant fa3 --strict --page-size 16)
run "u128 page16 default" "" "${u128[@]}"
run "u128 page16 3wg" "consumer_warpgroups=3" "${u128[@]}"
run "u128 page16 3wg s3" "consumer_warpgroups=3,stages=3" "${u128[@]}"
run "u128 page16 s3" "stages=3" "${u128[@]}"
run "u128 page16 gather noinc" "paged_gather=1,gather_noinc=1" "${u128[@]}"
run "u128 page16 gather noinc s3" "paged_gather=1,gather_noinc=1,stages=3" "${u128[@]}"
c192=(-b 2 -s 4096 --heads-q 12 --heads-kv 4 -d 192 --causal --variant fa3 --strict --page-size 64)
u192=(-b 2 -s 4096 --heads-q 12 -d 192 --variant fa3 --strict --page-size 64)
u96=(-b 2 -s 4096 --heads-q 24 --heads-kv 8 -d 96 --variant fa3 --strict --page-size 64)
run "u192 page64 new" "" "${u192[@]}"; run "u192 page64 n112" "block_n=112" "${u192[@]}"
run "c192 page64 new" "" "${c192[@]}"; run "c192 page64 n112" "block_n=112" "${c192[@]}"
run "u96 page64 new" "" "${u96[@]}"; run "u96 page64 n96" "block_n=96" "${u96[@]}"
stamp whole-page
timeout 120 python3 bench/sweep.py --lib build-device/libflashjit.so --dtypes bf16 --out /tmp/st.json \
  bench/ab_lists/session30_stages.txt >> $O/ab.txt 2>&1
stamp stages-sweep
for sp in 0 2; do
  FLASHJIT_FA3_TUNING=$([ $sp = 0 ] || echo section_pairs=$sp) timeout 70 bash bench/ncu_profile.sh /tmp/ncu$sp fa3_d128 2>&1 |
    grep -E "Duration|DRAM Throughput|L2 Hit|SM Frequency|TFLOP|Elapsed Cycles" | sed "s/^/sections of ${sp:-8} pairs (0: default 8): /" >> $O/ncu-sections.txt
done
stamp ncu-sections
NCU_SOURCE=1 timeout 170 bash bench/ncu_profile.sh $O fa3_d128 > /dev/null 2>&1
stamp ncu-source
exit 0
