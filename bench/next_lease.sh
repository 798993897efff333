#!/usr/bin/env bash
# A device lease's calls (perf-notes "For the next session"). Here first: `bash scripts/pack-device.sh`
# and `bash scripts/make-mlir-parity.sh` (build-device/, ~40 MB); then
# run(command="bash bench/next_lease.sh $OUT [MODE]", carry=["build-device"]), one call per mode, each
# well under the 600 s a call may take:
#  tests  ~450 s: the whole GPU suite with the MLIR parity check, then the gather's A/Bs at one key a
#         page (run 33).
#  decide ~400 s: the paged GPU tests, then session 32's planner decisions: fa2 or fa3's gather by head dim, the gather's noinc
#         form, whole-page key blocks by head dim, three warpgroups on 16-key pages, issue 3's d128 row.
#  brief  ~200 s: the fa3 paged GPU tests and the far-page cases, then one A/B per decision.
#  rows   ~400 s: issue 3's open prefill rows (d128 S4096, causal d64/d192 S1024, d128 S1024) and the
#         decode rows beside cuDNN (bench/compare.py), and the host-side costs (flashjit_host_bench).
#  sanitize      gpu-check's compute-sanitizer problems (memcheck, racecheck), no tests.
#  ncu-short     Nsight Compute of the causal S1024 rows at d192 and d64, ours and cuDNN's kernels.
#  dynamic       session 33's dynamic tiles: their GPU test, then drawn against the snake (causal rows).
#  drawn  ~450 s: session 34's default (drawn causal tiles): sanitizers, then the whole GPU suite + parity.
#  causal-rows ~120 s: the Q-in-registers GPU tests, issue 3's causal rows (and d128 S4096) beside
#         cuDNN, then the snake exception's A/B.
#  drawn-brief ~450 s: sanitizers, the suite without decode's tests and parity, three causal rows.
#  short-causal  one tuning knob at a time on the causal S1024 rows at d192 and d64.
#  knobs36 ~120 s: the knobs run 35f left out, on the drawn causal S1024 kernels at d64 and d192.
#  desc-advance ~250 s: kDescAdvance's bitwise GPU test, then issue 3's rows against desc_advance=0.
#  d64-source   Nsight Compute with stall samples by SASS line, d64 S1024 causal, ours and cuDNN's.
#  da-source    the same for our d64 S1024 causal kernel with and without advanced descriptors.
#  softmax-forms ~250 s: session 37's two softmax tunings (pingpong turns over the softmax, the exponent
#         as (s - max) * c): their GPU tests, then each alternated with the planner's kernel on issue 3's rows.
#  skip-masked ~150 s: session 37's skipped exponentials of the prologue's masked chunks: the bitwise
#         GPU test, then alternated with the planner's kernel on the causal rows.
#  session38 ~80 s (H100) / ~450 s (H200): the d64 S1024 causal key blocks 96/112 with Q in registers
#         alternated with the planner's 128; on an H200 issue 3's open rows beside cuDNN; on either GPU
#         the host's hot path, session 37's library against this one; on an H200 the other prefill rows.
#  h200   the same without the key blocks; on any other GPU it runs the softmax-form tunings' GPU tests
#         (~30 s), or with a third argument `tests` (~260 s) the GPU suite but decode's tests.
#  session39 ~120 s (H100) / ~550 s (H200): the half-form skip of the prologue's masked exponentials
#         (skip_masked_groups=2): its bitwise GPU tests, then alternated with the planner's kernel on
#         the S1024 causal rows at d64/d128/d192; on an H200 then everything h200 runs.
#  row-sums ~150 s (H100): partial row sums (row_sum_partials=2/4): their GPU test, then alternated
#         with the planner's one chain on the S1024 causal rows and d128 S4096; on an H200 then h200's.
#  knobs40 / knobs40b ~100 s each (H200): the open rows' knobs alternated with the planner's kernel.
#  sections40 ~150 s (H200): unmasked walks' L2 section sizes at S4096, d64-d256.
#  sections40b ~100 s (H200): the sizes of ~8 MiB of K/V a section at S1024 and d80 S4096.
#  sections40c ~350 s: the library before kL2UnmaskedSectionShare (old-lib) against this one,
#         TARGETS.md's prefill rows beside cuDNN, then the prefill GPU tests.
#  check41 ~200 s: sections40c cut short for a small device budget: the prefill GPU tests first, then
#         one round of the two libraries on four rows.
#  causal-sections41 ~80 s: causal S1024 walks in L2 sections larger than the drawn default (d64 32
#         pairs, d192 16), alternated with it, two rounds.
#  brief42 ~180 s: for a budget under ~300 s: the two libraries on d128 S4096 (bf16, fp16), then the
#         prefill GPU tests, so that a call cut short still brings back the open row's A/B.
#  session42 ~430 s: sections40c, then causal-sections41, in one call (a failed machine start costs
#         90-180 s of device time, more than the shorter mode takes).
#  session43 ~330 s: drawn causal sections of 48 and 64 pairs at d64 S1024 against the default 32,
#         three rounds; every S1024 row (d64-d256, causal and not) beside cuDNN; compute-sanitizer.
#  d256-causal43 ~120 s: the planner's knobs one at a time on d256 S1024 causal (×0.97 beside cuDNN on the
#         H100 in run 43b, ×1.00-1.01 on the H200 in run 41c), alternated with its kernel, two rounds.
#  d256-causal43b ~200 s: run 43c's two leaders at d256 causal (lazy rescale, sections of 32 pairs) and
#         their sum alternated with the planner's kernel, S1024 and S16384, then beside cuDNN.
#  session43b ~400 s: session 43's planner change (lazy rescale and sections of 32 pairs for d256 causal):
#         HEAD before it (old-lib) alternated with this one on the d256 causal rows, the lazy rescale
#         tried at d192 causal, the rows beside cuDNN, then the prefill GPU tests.
#  session43c ~380 s: session 43's final planner (lazy rescale at d192/d256 causal, 32-pair sections for
#         d256's short walks) against HEAD before it (old-lib), 32 pairs forced on d256's longer walks,
#         the rows beside cuDNN, then the prefill GPU tests.
#  rest43 ~300 s: the GPU tests session43c left out (paged, decode, the tunings' own; the lazy kernels
#         at d192/d256 causal now serve paged and varlen specs too), then d192 S1024 causal eager
#         against lazy, three more rounds.
#  d192-causal43 ~100 s: d192 S1024 causal's knobs again now that it rescales lazily, each beside the
#         planner's kernel, two rounds.
#  h200-check44 ~480 s, for an H200: session43c (old-lib: the library of ed889b6, before session 43's
#         planner), then, where build-device/old-lib40 holds the library before 5da542b, that rule's
#         d128 S4096 A/B, then TARGETS.md's prefill rows and every S1024 row beside cuDNN.
#  h200-brief44 ~200 s, for an H200 when too little device time is left for h200-check44: session 43's
#         planner (old-lib) against this one on d256 / d192 S1024 causal and the unmasked-section rule
#         (old-lib40) on d128 S4096, two rounds each, then the open rows and d256 S1024 causal beside cuDNN.
#  open-rows44 ~80 s, when an H100 comes for h200-check44: issue 3's open rows beside cuDNN (d128 S4096,
#         d256 S4096, d64 / d192 S1024 causal).
#  timeline45 ~50 s: the timeline build's GPU test, then on issue 3's open rows (d128 S4096, d64 / d192
#         S1024 causal, d256 S4096) the default and the timeline build timed, and one timeline each
#         (timeline.txt, by bench/timeline.py; raw files in timelines.tgz).
#  h200-brief45 ~250 s: timeline45, then h200-brief44.
#  sbp46  ~150 s: S awaited before the PV issue (s_before_pv=1, `.sbp`): its bitwise GPU test, then
#         alternated with the planner's kernel, three rounds, on issue 3's open rows (d128 S4096 bf16 /
#         fp16, d256 S4096, d64 / d192 S1024 causal), then timelines of d128 S4096 and d64 S1024 causal
#         with it (timeline.txt). sbp46-brief ~90 s: two rounds on d128 S4096 and d64 / d192 S1024 causal.
#  ebm47  ~200 s (H100): exp_before_max=1's GPU tests (PrefillExpBeforeMaxGpu), then three alternated
#         rounds against the planner's kernel on d128 S4096 (bf16, fp16) and d64 S1024 causal;
#         ebm47-brief ~150 s: two rounds.
#  h100-alt44 ~60 s, when an H100 comes instead: d64 S1024 causal in drawn sections of 64 pairs
#         alternated with the planner's 32, five rounds (session 43: +0.7% on average, not adopted).
#  early-qk44 ~250 s: session 44's two pingpong-turn tunings, the QK's descriptors built before the K
#         wait (early_qk_desc=1) and turns over the QK only (turn_over_qk=1): their bitwise GPU tests,
#         then each alternated with the planner's kernel, three rounds, on the pingpong rows (d128 S4096 /
#         S1024, d64 / d192 / d256 S1024 causal, d256 S4096 causal).
#  ptxas ~150 s (H100) / ~650 s (H200: give it the whole call): ptxas -O1 (ptxas_opt_level=1): its
#         GPU test, then alternated with the default -O3 on d64/d192 S1024 causal and d128/d256 S4096;
#         on an H200 then everything h200 runs.
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
# A build-device/ from before session 37 lacks its defaults (drawn causal tiles, Q in registers for
# the short causal tile up to d64, advanced wgmma descriptors), one from before session 39 its
# tunings (the half-form skip, partial row sums), one from before session 40 its ptxas level: stop,
# don't time it.
if ! grep -q "ptxas_opt_level" build-device/libflashjit.so ||
  ! build-device/tests/flashjit_gpu_tests --gtest_list_tests | grep -q PrefillPtxasOptLevelGpu; then
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
# Two tunings of one row alternated, twice: alternate LABEL NAME_A TUNING_A NAME_B TUNING_B BENCH_ARGS...
alternate() {
  local label=$1 name_a=$2 tuning_a=$3 name_b=$4 tuning_b=$5
  shift 5
  for rep in 1 2; do
    run "$label $name_a #$rep" "$tuning_a" "$@"
    run "$label $name_b #$rep" "$tuning_b" "$@"
  done
}
# One causal row ("d heads seqlen batch"), the snake (dynamic_tiles=0) and drawn tiles alternated,
# twice; leaves the row's bench arguments in the array named by $2 for further runs.
snake_against_drawn() {
  local d h s b
  read -r d h s b <<<"$1"
  local -n args=$2
  args=(-b "$b" -s "$s" --heads-q "$h" -d "$d" --causal --variant fa3 --strict)
  alternate "d$d S$s causal" snake dynamic_tiles=0 drawn dynamic_tiles=1 "${args[@]}"
}
# Issue 3's causal S1024 row at head dim $1 (compare.py's shape: d64 32 heads, d192 11, d256 8, batch 16),
# one run per tuning in the rest of the arguments ("": the planner's kernel).
knob_sweep() {
  local d=$1
  shift
  local heads=$(( d == 192 ? 11 : d == 256 ? 8 : 32 ))
  for t in "$@"; do
    run "d$d S1024 causal" "$t" -b 16 -s 1024 --heads-q "$heads" -d "$d" --causal --variant fa3 --strict
  done
}
# One "LABEL:BENCH_ARGS" row under TUNING (fa3, strict): run_row ROW TUNING.
run_row() {
  local args
  read -r -a args <<<"${1#*:}"
  run "${1%%:*}" "$2" "${args[@]}" --variant fa3 --strict
}
# The library in build-device/$OLD_LIB (default old-lib), then this one, on each "LABEL:BENCH_ARGS" row
# (fa3, strict).
old_against_new() {
  local row
  for row in "$@"; do
    LD_LIBRARY_PATH=$PWD/build-device/${OLD_LIB:-old-lib}:$PWD/build-device run_row "${row%%:*} old:${row#*:}" ""
    run_row "${row%%:*} new:${row#*:}" ""
  done
}
# The rows old_against_new runs in more than one mode.
d128_s4096="d128 S4096:-b 4 -s 4096 --heads-q 16 -d 128"
d128_s4096_fp16="d128 S4096 fp16:-b 4 -s 4096 --heads-q 16 -d 128 --dtype fp16"
d96_s4096="d96 S4096:-b 4 -s 4096 --heads-q 21 -d 96"
d128_s1024="d128 S1024:-b 16 -s 1024 --heads-q 16 -d 128"
d192_s1024="d192 S1024:-b 16 -s 1024 --heads-q 11 -d 192"
d64_s1024c="d64 S1024 causal:-b 16 -s 1024 --heads-q 32 -d 64 --causal"
d192_s1024c="d192 S1024 causal:-b 16 -s 1024 --heads-q 11 -d 192 --causal"
d192_s4096c="d192 S4096 causal:-b 4 -s 4096 --heads-q 11 -d 192 --causal"
d256_s1024c="d256 S1024 causal:-b 16 -s 1024 --heads-q 8 -d 256 --causal"
d256_s2048c="d256 S2048 causal:-b 8 -s 2048 --heads-q 8 -d 256 --causal"
d256_s4096c="d256 S4096 causal:-b 4 -s 4096 --heads-q 8 -d 256 --causal"
d256_s16384c="d256 S16384 causal:-b 1 -s 16384 --heads-q 8 -d 256 --causal"
# Issue 3's rows still short of their targets (compare.py's names).
open_rows=d128s4096,d256s4096,d64s1024c,d192s1024c
# compare.py's prefill ROWS ("targets": TARGETS.md's) beside cuDNN, appended to $O/TXT, the JSON to
# $O/JSON: compare_rows TXT JSON TIMEOUT ROWS [compare.py ARGS...].
compare_rows() {
  local txt=$1 json=$2 limit=$3 rows=()
  [ "$4" = targets ] || rows=(--prefill-rows "$4")
  shift 4
  timeout "$limit" python3 bench/compare.py --lib build-device/libflashjit.so --out "$O/$json" --ops prefill \
    "${rows[@]}" "$@" 2>&1 | grep -v "info: \(compil\|bundle\)" >>"$O/$txt"
}
# GPU tests matching FILTER into $O/gpu-check.txt, stopped after TIMEOUT s, each test after
# TEST_TIMEOUT s: gpu_tests LABEL TIMEOUT TEST_TIMEOUT JOBS FILTER.
gpu_tests() {
  timeout "$2" bash scripts/gpu-check.sh "$O" --test-jobs="$4" --test-timeout="$3" --no-parity \
    --gtest-filter="$5" >"$O/gpu-check.txt" 2>&1
  stamp "$1 tests rc=$?"
}
# The prefill GPU tests: the dense cases and the tail split's.
prefill_tests() { gpu_tests prefill 150 140 8 'Prefill/PrefillGpu.*:PrefillTailSplitGpu.*'; }
# compute-sanitizer on gpu-check's problems, no tests; the summary lines into $O/sanitize.txt.
sanitize_summary() { # timeout in seconds
  timeout "$1" bash scripts/gpu-check.sh /tmp/san --no-tests --no-parity --sanitize >"$O/sanitize.txt" 2>&1
  grep -E "^---|SUMMARY" /tmp/san/sanitizer.txt >>"$O/sanitize.txt"
  stamp sanitize
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
decide)
  # First the GPU tests whose expectations session 32 changed (the paged and gather tests), then the A/Bs.
  timeout 220 bash scripts/gpu-check.sh "$O" --test-jobs=8 --test-timeout=190 --no-parity \
    --gtest-filter='*Paged*:*paged*:*Gather*:*gather*:*Stages*' >"$O/gpu-check.txt" 2>&1
  stamp paged-tests
  # Session 32's planner decisions (perf-notes "Session 32"), each A/B within this one call.
  # (1) fa2 or fa3's gather for pages fa3 must gather, by head dim (run 33e, H100: fa2 +21% at d64, fa3
  # ahead from d80). Prediction: fa2 ahead up to d64, d72 within 5%, the gather ahead from d80.
  for d in 48 64 72 80; do
    c=(-b 8 -s 1024 --seqlen-k 16384 --heads-q 32 --heads-kv 8 -d $d --causal --page-size 1)
    run "d$d chunked page1 fa2" "" "${c[@]}" --variant fa2
    run "d$d chunked page1 gather noinc" "gather_noinc=1" "${c[@]}" --variant fa3 --strict
  done
  for d in 64 72; do
    c=(-b 4 -s 4096 --heads-q 32 --heads-kv 8 -d $d --causal --page-size 1)
    run "d$d causal 4x4096 page1 fa2" "" "${c[@]}" --variant fa2
    run "d$d causal 4x4096 page1 gather noinc" "gather_noinc=1" "${c[@]}" --variant fa3 --strict
  done
  stamp fa2-or-gather
  # (2) the gather's noinc form, now its default (run 33, H100: +5.8% at d128 chunked).
  c=(-b 8 -s 1024 --seqlen-k 16384 --heads-q 32 --heads-kv 8 -d 128 --causal --page-size 1 --variant fa3 --strict)
  run "d128 chunked page1 gather fenced" "gather_noinc=0" "${c[@]}"
  run "d128 chunked page1 gather noinc" "gather_noinc=1" "${c[@]}"
  stamp noinc
  # (3) whole-page key blocks, pages of 64 (run 33, H100: d96 N64 -4.8% against N96 unmasked).
  # Prediction: N96 ahead at d96/d104 unmasked by 2-5%, within 2% causal; N64 ahead at d80.
  for dn in 96:96 104:96 80:112; do
    d=${dn%:*} n=${dn#*:}
    u=(-b 2 -s 4096 --heads-q 24 --heads-kv 8 -d $d --variant fa3 --strict --page-size 64)
    run "u$d page64 whole N64" "block_n=64" "${u[@]}"
    run "u$d page64 N$n" "block_n=$n" "${u[@]}"
    if [ "$d" != 80 ]; then
      run "c$d page64 whole N64" "block_n=64" "${u[@]}" --causal
      run "c$d page64 N$n" "block_n=$n" "${u[@]}" --causal
    fi
  done
  stamp whole-page
  # (4) unmasked d128 16-key pages with three warpgroups (run 33, H100: +1.7%).
  u128=(-b 4 -s 4096 --heads-q 16 -d 128 --variant fa3 --strict --page-size 16)
  run "u128 page16 default" "" "${u128[@]}"
  run "u128 page16 3wg" "consumer_warpgroups=3" "${u128[@]}"
  # (5) issue 3's row, d128 S4096 unmasked contiguous, twice (684 on the H200 in run 32b).
  for rep in 1 2; do
    run "d128 S4096 unmasked #$rep" "" -b 4 -s 4096 --heads-q 16 -d 128 --variant fa3 --strict
  done
  stamp issue3
  ;;
brief)
  # What little device time is left: the fa3 paged tests and the d64 far-page cases under the new
  # defaults, then one A/B per decision.
  timeout 150 bash scripts/gpu-check.sh "$O" --test-jobs=8 --test-timeout=140 --no-parity \
    --gtest-filter='PrefillFa3PagedGpu.*:*pages_1GiB*:*pages_2GiB*' >"$O/gpu-check.txt" 2>&1
  stamp paged-tests
  for d in 64 72; do
    c=(-b 8 -s 1024 --seqlen-k 16384 --heads-q 32 --heads-kv 8 -d $d --causal --page-size 1)
    run "d$d chunked page1 fa2" "" "${c[@]}" --variant fa2
    run "d$d chunked page1 gather noinc" "" "${c[@]}" --variant fa3 --strict
  done
  u=(-b 2 -s 4096 --heads-q 24 --heads-kv 8 -d 96 --variant fa3 --strict --page-size 64)
  run "u96 page64 whole N64" "block_n=64" "${u[@]}"
  run "u96 page64 N96" "block_n=96" "${u[@]}"
  run "d128 S4096 unmasked" "" -b 4 -s 4096 --heads-q 16 -d 128 --variant fa3 --strict
  stamp ab
  ;;
rows)
  # Issue 3's open rows and issue 4's decode rows beside cuDNN (bench/compare.py, the TARGETS method),
  # and the host-side costs (flashjit_host_bench: the hot path was last timed in run 24).
  timeout 150 build-device/flashjit_host_bench --benchmark_out="$O/host.json" --benchmark_out_format=json 2>&1 |
    grep -E "forward|launch|resolve|decode" >"$O/host.txt"
  stamp host
  timeout 250 python3 bench/compare.py --lib build-device/libflashjit.so --out "$O/rows.json" --ops prefill \
    --prefill-rows d128s4096,d64s1024c,d192s1024c,d128s1024 2>&1 | grep -v "info: \(compil\|bundle\)" >"$O/rows.txt"
  stamp prefill-rows
  timeout 150 python3 bench/compare.py --lib build-device/libflashjit.so --out "$O/decode.json" --ops decode \
    2>&1 | grep -v "info: \(compil\|bundle\)" >"$O/decode.txt"
  stamp decode-rows
  ;;
sanitize)
  # compute-sanitizer memcheck and racecheck on gpu-check's problems (the gather's noinc form, the
  # default since session 32, among them), no tests.
  timeout 560 bash scripts/gpu-check.sh "$O" --no-tests --no-parity --sanitize >"$O/gpu-check.txt" 2>&1
  stamp sanitize
  ;;
ncu-short)
  # Issue 3's causal S1024 rows below cuDNN (d192, d64): our kernel beside cuDNN's, Nsight Compute.
  timeout 500 bash bench/ncu_profile.sh "$O" fa3_d192_s1024_causal,cudnn_fa_d192_s1024_causal,fa3_d64_s1024_causal,cudnn_fa_d64_s1024_causal >"$O/ncu-summary.txt" 2>&1
  stamp ncu-short
  ;;
d64-source)
  # Where d64 S1024 causal's fixed-latency waits and MIO throttle come from (run 36b): the stall
  # samples by SASS line, ours beside cuDNN's.
  NCU_SOURCE=1 timeout 400 bash bench/ncu_profile.sh "$O" fa3_d64_s1024_causal,cudnn_fa_d64_s1024_causal \
    >"$O/ncu-summary.txt" 2>&1
  stamp d64-source
  ;;
da-source)
  # Why advanced descriptors lose in the short causal tile (session 36): the d64 S1024 causal kernel
  # with and without them, stall samples by SASS line.
  NCU_SOURCE=1 timeout 400 bash bench/ncu_profile.sh "$O" fa3_d64_s1024_causal,fa3_d64_s1024_causal_da \
    >"$O/ncu-summary.txt" 2>&1
  stamp da-source
  ;;
desc-advance)
  # Session 36's default (kDescAdvance: a GEMM's wgmma descriptors advanced from its first by one
  # add). Its bitwise GPU test, then each of issue 3's rows against desc_advance=0, alternated, twice.
  timeout 120 build-device/tests/flashjit_gpu_tests --gtest_filter='PrefillDescAdvanceGpu.*' \
    >"$O/gpu-tests.log" 2>&1
  stamp "desc-advance-tests rc=$?"
  for row in "64 32 1024 16 --causal" "192 11 1024 16 --causal" "128 16 4096 4" "128 16 1024 16 --causal" \
    "256 8 1024 16 --causal" "64 32 4096 4" "192 11 4096 4" "128 16 4096 4 --causal"; do
    read -r d h s b causal <<<"$row"
    alternate "d$d S$s ${causal:-full}" built desc_advance=0 advanced "" \
      -b "$b" -s "$s" --heads-q "$h" -d "$d" $causal --variant fa3 --strict
  done
  stamp desc-advance-ab
  ;;
softmax-forms)
  # Session 37's tunings: the pingpong's turn over the softmax (cuDNN's order in the session 36
  # profile) and the exponent as (s - max) * c (cuDNN's FADD + FMUL). Their GPU tests first.
  timeout 150 build-device/tests/flashjit_gpu_tests \
    --gtest_filter='PrefillPingpongSoftmaxGpu.*:PrefillExpSubtractFirstGpu.*' >"$O/gpu-tests.log" 2>&1
  stamp "softmax-forms-tests rc=$?"
  for row in "64 32 1024 16 --causal" "192 11 1024 16 --causal" "128 16 1024 16 --causal" "96 21 1024 16 --causal" \
    "256 8 1024 16 --causal" "128 16 4096 4" "64 32 4096 4"; do
    read -r d h s b causal <<<"$row"
    args=(-b "$b" -s "$s" --heads-q "$h" -d "$d" $causal --variant fa3 --strict)
    alternate "d$d S$s ${causal:-full}" gemm-turns "" softmax-turns pingpong_softmax=1 "${args[@]}"
    alternate "d$d S$s ${causal:-full}" ffma "" subtract-first exp_subtract_first=1 "${args[@]}"
  done
  stamp softmax-forms-ab
  ;;
skip-masked)
  # Session 37: the prologue (diagonal) block's softmax without the exponentials of chunks the mask
  # hides from a whole warp. Its bitwise GPU test, then the causal rows against the planner's kernel.
  timeout 120 build-device/tests/flashjit_gpu_tests --gtest_filter='PrefillSkipMaskedGroupsGpu.*' \
    >"$O/gpu-tests.log" 2>&1
  stamp "skip-masked-tests rc=$?"
  for row in "64 32 1024 16" "96 21 1024 16" "128 16 1024 16" "80 26 1024 16" "192 11 1024 16" "256 8 1024 16" \
    "64 32 4096 4" "128 16 4096 4"; do
    read -r d h s b <<<"$row"
    alternate "d$d S$s causal" full "" skip skip_masked_groups=1 \
      -b "$b" -s "$s" --heads-q "$h" -d "$d" --causal --variant fa3 --strict
  done
  stamp skip-masked-ab
  ;;
dynamic)
  # Session 33's dynamic tiles: their GPU test and the tail split's (which shares the workspace code),
  # then drawn tiles against the snake on causal rows, alternated, twice.
  timeout 170 bash scripts/gpu-check.sh "$O" --test-jobs=8 --test-timeout=150 --no-parity \
    --gtest-filter='PrefillDynamicTilesGpu.*:PrefillTailSplitGpu.*' >"$O/gpu-check.txt" 2>&1
  stamp dynamic-tests
  for row in "192 11 1024 16" "64 32 1024 16" "128 16 4096 4"; do
    snake_against_drawn "$row" c
    read -r d _ s _ <<<"$row"
    if [ "$s" = 1024 ]; then
      for pairs in 8 17; do
        run "d$d S$s causal drawn, sections of $pairs" "dynamic_tiles=1,causal_section_pairs=$pairs" "${c[@]}"
      done
    fi
  done
  stamp dynamic-ab
  ;;
drawn)
  # Session 34's default (drawn tiles for causal walks): compute-sanitizer on gpu-check's problems (a
  # drawn d192 causal one among them), then the whole GPU suite with the MLIR parity check.
  sanitize_summary 120
  timeout 390 bash scripts/gpu-check.sh "$O" --test-jobs=8 --test-timeout=300 >"$O/gpu-check.txt" 2>&1
  stamp tests
  ;;
drawn-brief)
  # All of the above that fits one call: the sanitizers, the GPU suite but decode's (untouched by the
  # drawn default) without the parity check, then the causal rows.
  sanitize_summary 100
  timeout 230 bash scripts/gpu-check.sh "$O" --test-jobs=8 --test-timeout=200 --no-parity \
    --gtest-filter='-Decode*' >"$O/gpu-check.txt" 2>&1
  stamp tests
  timeout 120 python3 bench/compare.py --lib build-device/libflashjit.so --out "$O/rows.json" --ops prefill \
    --prefill-rows d192s1024c,d64s1024c,d128s16384c \
    2>&1 | grep -v "info: \(compil\|bundle\)" >"$O/rows.txt"
  stamp causal-rows
  ;;
causal-rows)
  # Session 35's default first (Q in registers for the short causal tile up to d64): its GPU tests.
  timeout 120 build-device/tests/flashjit_gpu_tests --gtest_filter='PrefillQInRegistersGpu.*' \
    >"$O/gpu-tests.log" 2>&1
  stamp "qr-tests rc=$?"
  # Issue 3's causal rows beside cuDNN (bench/compare.py), every one the drawn tiles now walk.
  timeout 400 python3 bench/compare.py --lib build-device/libflashjit.so --out "$O/rows.json" --ops prefill \
    --prefill-rows d64s1024c,d192s1024c,d256s1024c,d64s16384c,d80s16384c,d128s16384c,d256s16384c,d128s4096 \
    2>&1 | grep -v "info: \(compil\|bundle\)" >"$O/rows.txt"
  stamp causal-rows
  # The short causal tile's snake exception (d72-d128, the H100's 0.8-1.0%), drawn against the snake.
  for row in "80 26 1024 16" "96 21 1024 16" "128 16 1024 16"; do
    snake_against_drawn "$row" c
  done
  stamp snake-exception
  ;;
short-causal)
  # Issue 3's causal S1024 rows (compare.py's shapes), one knob at a time against the planner's kernel.
  knob_sweep 192 "" lazy_rescale=1 separate_o=1 rescale_before_pv=1 cross_tile_overlap=1 q_in_registers=0 \
    block_n=112 block_n=80 consumer_warpgroups=3 row_max_partials=2 exp2_poly_every=0 causal_sections=1 ""
  knob_sweep 64 "" lazy_rescale=1 separate_o=1 rescale_before_pv=1 cross_tile_overlap=1 q_in_registers=0 \
    block_n=112 consumer_warpgroups=3 row_max_partials=2 exp2_poly_every=0 ""
  stamp short-causal
  ;;
knobs36)
  # Session 35: the knobs run 35f did not time on the drawn causal S1024 kernels, each between two
  # readings of the default.
  knob_sweep 64 "" pingpong=0 stages=3 stages=4 q_desc_per_step=0 programmatic_launch=1 row_max_partials=8 \
    l2_promotion=0 l2_promotion=128 q_in_registers=1 ""
  knob_sweep 192 "" pingpong=0 q_desc_per_step=0 programmatic_launch=1 row_max_partials=2 row_max_partials=8 \
    l2_promotion=0 q_in_registers=1 ""
  stamp knobs36
  ;;
knobs40)
  # Session 40: the open rows' knobs on the H200 (the defaults since session 33 were chosen on H100s),
  # each tuning alternated with the planner's kernel, two rounds.
  for rep in 1 2; do
    for t in "" desc_advance=0 q_desc_per_step=0 cluster_m=1 tail_split=0 lazy_rescale=1 block_n=128 block_n=176; do
      run "d128 S4096" "$t" -b 4 -s 4096 --heads-q 16 -d 128 --variant fa3 --strict
    done
    for t in "" desc_advance=0 lazy_rescale=0 pingpong=1 cluster_m=1 block_n=64 block_n=96; do
      run "d256 S4096" "$t" -b 4 -s 4096 --heads-q 8 -d 256 --variant fa3 --strict
    done
    knob_sweep 64 "" q_in_registers=0 dynamic_tiles=0 desc_advance=1 lazy_rescale=1 block_n=112 pingpong_softmax=1
    knob_sweep 192 "" dynamic_tiles=0 desc_advance=0 lazy_rescale=1 block_n=112 block_n=80 q_in_registers=1
  done
  stamp knobs40
  ;;
knobs40b)
  # Session 40, second sweep on the H200: walk order, L2 promotion, launch and softmax knobs.
  for rep in 1 2; do
    for t in "" section_pairs=4 section_pairs=16 l2_promotion=256 programmatic_launch=1 rescale_before_pv=1 \
      first_block_in_loop=1 row_max_partials=2 row_max_partials=8 consumer_warpgroups=3; do
      run "d128 S4096" "$t" -b 4 -s 4096 --heads-q 16 -d 128 --variant fa3 --strict
    done
    for t in "" section_pairs=4 l2_promotion=256 programmatic_launch=1 rescale_before_pv=1 q_desc_per_step=0; do
      run "d256 S4096" "$t" -b 4 -s 4096 --heads-q 8 -d 256 --variant fa3 --strict
    done
    knob_sweep 64 "" causal_section_pairs=2 causal_section_pairs=8 programmatic_launch=1 l2_promotion=256 \
      row_max_partials=2 exp2_poly_every=8
    knob_sweep 192 "" causal_section_pairs=2 causal_section_pairs=8 programmatic_launch=1 l2_promotion=256 lazy_rescale=1
  done
  stamp knobs40b
  ;;
sections40)
  # Session 40: unmasked walks' L2 sections on the H200 (run 41e: 4 pairs +0.9% at d128 S4096), the
  # planner's size alternated with others, three rounds, both dtypes at d128.
  for rep in 1 2 3; do
    for t in "" section_pairs=2 section_pairs=3 section_pairs=4 section_pairs=6; do
      run "d128 S4096" "$t" -b 4 -s 4096 --heads-q 16 -d 128 --variant fa3 --strict
      run "d128 S4096 fp16" "$t" -b 4 -s 4096 --heads-q 16 -d 128 --dtype fp16 --variant fa3 --strict
    done
    for t in "" section_pairs=4 section_pairs=8; do
      run "d64 S4096" "$t" -b 4 -s 4096 --heads-q 32 -d 64 --variant fa3 --strict
      run "d96 S4096" "$t" -b 4 -s 4096 --heads-q 21 -d 96 --variant fa3 --strict
    done
    for t in "" section_pairs=2 section_pairs=4; do
      run "d192 S4096" "$t" -b 4 -s 4096 --heads-q 11 -d 192 --variant fa3 --strict
      run "d256 S4096" "$t" -b 4 -s 4096 --heads-q 8 -d 256 --variant fa3 --strict
    done
  done
  stamp sections40
  ;;
sections40b)
  # Session 40: the sizes a rule of ~8 MiB of K/V per section would give, on the rows sections40 left
  # out (S1024 unmasked, d80 S4096), alternated with the planner's, three rounds.
  for rep in 1 2 3; do
    for t in "" section_pairs=4; do
      run "d80 S4096" "$t" -b 4 -s 4096 --heads-q 26 -d 80 --variant fa3 --strict
    done
    for dp in 64:32:32 80:26:16 96:21:16 128:16:16 192:11:8 256:8:8; do
      IFS=: read -r d h n <<<"$dp"
      for t in "" section_pairs=$n; do
        run "d$d S1024" "$t" -b 16 -s 1024 --heads-q "$h" -d "$d" --variant fa3 --strict
      done
    done
  done
  stamp sections40b
  ;;
sections40c)
  # Session 40's unmasked sections of ~8 MiB (kL2UnmaskedSectionShare): the library before it
  # (build-device/old-lib) alternated with this one, TARGETS' prefill rows beside cuDNN (outputs
  # compared with cuDNN's), then the prefill GPU tests.
  for rep in 1 2; do
    old_against_new "$d128_s4096" "$d128_s4096_fp16" "$d96_s4096" "d80 S4096:-b 4 -s 4096 --heads-q 26 -d 80" \
      "d64 S1024:-b 16 -s 1024 --heads-q 32 -d 64" "$d128_s1024" "$d192_s1024" \
      "d256 S1024:-b 16 -s 1024 --heads-q 8 -d 256"
  done
  stamp sections-ab
  compare_rows targets.txt targets.json 150 targets
  stamp targets
  prefill_tests
  ;;
check41)
  # sections40c for a small budget: the prefill GPU tests first, then one round of the libraries.
  prefill_tests
  old_against_new "$d128_s4096" "$d96_s4096" "$d128_s1024" "$d192_s1024"
  stamp sections-ab
  ;;
brief42)
  old_against_new "$d128_s4096" "$d128_s4096_fp16"
  stamp sections-ab
  prefill_tests
  ;;
session42)
  bash "$0" "$O" sections40c
  bash "$0" "$O" causal-sections41
  ;;
session43)
  # Run 43a had d64 S1024 causal in sections of 64 pairs lead the default 32 by 1.7% and then 0.3%:
  # three more rounds, with 48 beside them.
  for rep in 1 2 3; do
    knob_sweep 64 "" causal_section_pairs=48 causal_section_pairs=64
  done
  stamp d64-sections
  # The unmasked-section rule (5da542b) moved the S1024 rows on the H100 (run 43a, +0.5..4%): every
  # S1024 row beside cuDNN, causal and not.
  compare_rows s1024.txt s1024.json 220 \
    d64s1024,d64s1024c,d80s1024,d80s1024c,d96s1024,d96s1024c,d128s1024,d128s1024c,d192s1024,d192s1024c,d256s1024,d256s1024c
  stamp s1024-rows
  sanitize_summary 200
  ;;
d256-causal43)
  for rep in 1 2; do
    knob_sweep 256 "" lazy_rescale=1 pingpong=0 pingpong=0,lazy_rescale=0 block_n=64 stages=3 \
      causal_section_pairs=8 causal_section_pairs=32 desc_advance=0 q_desc_per_step=0 dynamic_tiles=0 \
      programmatic_launch=1
  done
  stamp d256-knobs
  ;;
d256-causal43b)
  lead="lazy_rescale=1,causal_section_pairs=32"
  for rep in 1 2 3; do
    for t in "" lazy_rescale=1 causal_section_pairs=32 "$lead"; do
      knob_sweep 256 "$t"
      run_row "$d256_s16384c" "$t"
    done
  done
  stamp d256-leaders
  n=0
  for alt in lazy_rescale=1 "$lead"; do
    n=$((n + 1))
    compare_rows d256-rows.txt "d256-alt$n.json" 100 d256s1024c,d256s16384c --alt-tuning "$alt"
  done
  stamp d256-rows
  ;;
session43b)
  for rep in 1 2 3; do
    old_against_new "$d256_s1024c" "d256 S1024 causal fp16:${d256_s1024c#*:} --dtype fp16" "$d256_s4096c" "$d256_s16384c"
  done
  stamp d256-ab
  for rep in 1 2 3; do
    knob_sweep 192 "" lazy_rescale=1
    run_row "$d192_s4096c" ""
    run_row "$d192_s4096c" lazy_rescale=1
  done
  stamp d192-lazy
  compare_rows rows.txt rows.json 100 d256s1024c,d256s16384c,d192s1024c
  stamp rows
  prefill_tests
  ;;
session43c)
  for rep in 1 2 3; do
    old_against_new "$d256_s1024c" "$d256_s4096c" "$d256_s16384c" "$d192_s1024c" "$d192_s4096c"
    for t in "" causal_section_pairs=32; do
      run_row "$d256_s2048c" "$t"
      run_row "$d256_s4096c" "$t"
    done
  done
  stamp causal-ab
  compare_rows rows.txt rows.json 100 d256s1024c,d192s1024c,d256s16384c
  stamp rows
  prefill_tests
  ;;
rest43)
  gpu_tests rest 300 280 8 '*-Prefill/PrefillGpu.*:PrefillTailSplitGpu.*'
  for rep in 1 2 3; do
    knob_sweep 192 lazy_rescale=0 ""
  done
  stamp d192-lazy
  ;;
h200-check44)
  bash "$0" "$O" session43c
  if [ -e build-device/old-lib40/libflashjit.so.0 ]; then
    for rep in 1 2; do
      OLD_LIB=old-lib40 old_against_new "$d128_s4096" "$d128_s4096_fp16"
    done
    stamp sections-ab
  fi
  compare_rows targets.txt targets.json 170 targets
  stamp targets
  compare_rows s1024.txt s1024.json 130 \
    d64s1024,d64s1024c,d80s1024,d80s1024c,d96s1024,d96s1024c,d128s1024c,d192s1024,d192s1024c,d256s1024,d256s1024c
  stamp s1024-rows
  ;;
early-qk44)
  gpu_tests pingpong-turns 150 140 4 'PrefillEarlyQkDescGpu.*:PrefillTurnOverQkGpu.*'
  for rep in 1 2 3; do
    for row in "$d128_s4096" "$d128_s4096_fp16" "$d128_s1024" "$d64_s1024c" "$d192_s1024c" "$d256_s1024c" \
      "$d256_s4096c"; do
      run_row "$row" ""
      run_row "$row" early_qk_desc=1
      run_row "$row" turn_over_qk=1
    done
  done
  stamp pingpong-turns-ab
  ;;
h200-brief44)
  for rep in 1 2; do
    old_against_new "$d256_s1024c" "$d192_s1024c"
    OLD_LIB=old-lib40 old_against_new "$d128_s4096"
  done
  stamp brief-ab
  compare_rows open-rows.txt open-rows.json 150 "$open_rows,d256s1024c"
  stamp open-rows
  ;;
open-rows44)
  compare_rows open-rows.txt open-rows.json 150 "$open_rows"
  stamp open-rows
  ;;
timeline45)
  # Session 45's timeline build (timeline=1, `.tl`): its GPU test, then on issue 3's open rows the
  # default kernel and the timeline build timed one after the other (what recording costs), and one
  # timeline each, read by bench/timeline.py into timeline.txt (the raw files: timelines.tgz).
  gpu_tests timeline 150 140 4 'PrefillTimelineGpu.*'
  mkdir -p /tmp/tl
  for row in "$d128_s4096" "$d64_s1024c" "$d192_s1024c" "d256 S4096:-b 4 -s 4096 --heads-q 8 -d 256"; do
    run_row "$row" ""
    run_row "$row" timeline=1
    name=$(echo "${row%%:*}" | tr ' ' '_')
    read -r -a args <<<"${row#*:}"
    FLASHJIT_FA3_TUNING=timeline=1 timeout 30 $cli bench -n 20 "${args[@]}" --variant fa3 --strict \
      --timeline "/tmp/tl/$name.bin" >"/tmp/tl/$name.log" 2>&1 || tail -3 "/tmp/tl/$name.log" >>"$O/timeline.txt"
    { echo "== ${row%%:*}"; python3 bench/timeline.py "/tmp/tl/$name.bin" 2>&1; } >>"$O/timeline.txt"
  done
  tar czf "$O/timelines.tgz" -C /tmp/tl .
  stamp timeline
  ;;
sbp46 | sbp46-brief)
  gpu_tests s-before-pv 120 110 4 'PrefillSBeforePvGpu.*'
  rounds="1 2 3"
  rows=("$d128_s4096" "$d128_s4096_fp16" "d256 S4096:-b 4 -s 4096 --heads-q 8 -d 256" "$d64_s1024c" "$d192_s1024c")
  if [ "$mode" = sbp46-brief ]; then
    rounds="1 2"
    rows=("$d128_s4096" "$d64_s1024c" "$d192_s1024c")
  fi
  for rep in $rounds; do
    for row in "${rows[@]}"; do
      run_row "$row" ""
      run_row "$row" s_before_pv=1
    done
  done
  stamp s-before-pv-ab
  mkdir -p /tmp/tl
  for row in "${rows[@]:0:1}" "$d64_s1024c"; do
    name=$(echo "${row%%:*}" | tr ' ' '_')_sbp
    read -r -a args <<<"${row#*:}"
    FLASHJIT_FA3_TUNING=timeline=1,s_before_pv=1 timeout 30 $cli bench -n 20 "${args[@]}" --variant fa3 --strict \
      --timeline "/tmp/tl/$name.bin" >"/tmp/tl/$name.log" 2>&1 || tail -3 "/tmp/tl/$name.log" >>"$O/timeline.txt"
    { echo "== ${row%%:*} s_before_pv=1"; python3 bench/timeline.py "/tmp/tl/$name.bin" 2>&1; } >>"$O/timeline.txt"
  done
  tar czf "$O/timelines.tgz" -C /tmp/tl .
  stamp timeline-sbp
  ;;
ebm47 | ebm47-brief)
  # Exponentials before the block's max (session 47): its GPU tests (float64 on every kernel form, the
  # blocks that raise the max far), then alternated with the planner's kernel on the eager pingpong rows.
  gpu_tests exp-before-max 150 140 4 'PrefillExpBeforeMaxGpu.*'
  rounds="1 2 3"
  [ "$mode" = ebm47-brief ] && rounds="1 2"
  for rep in $rounds; do
    for row in "$d128_s4096" "$d128_s4096_fp16" "$d64_s1024c"; do
      run_row "$row" ""
      run_row "$row" exp_before_max=1
    done
  done
  stamp exp-before-max-ab
  ;;
h200-brief45)
  # The timeline (~50 s), then as much of h200-brief44 (~200 s) as the call's time allows.
  bash "$0" "$O" timeline45
  bash "$0" "$O" h200-brief44
  ;;
h100-alt44)
  for rep in 1 2 3 4 5; do
    knob_sweep 64 "" causal_section_pairs=64
  done
  stamp d64-sections64
  ;;
d192-causal43)
  for rep in 1 2; do
    for t in block_n=112 block_n=80 pingpong=0 causal_section_pairs=8 causal_section_pairs=24 dynamic_tiles=0; do
      knob_sweep 192 "" "$t"
    done
  done
  stamp d192-knobs
  ;;
causal-sections41)
  # Session 41: drawn causal walks in larger L2 sections than kDrawnSectionPairs(SmallDim), on the H200
  # for the first time since the drawn tiles came (run 35b-c chose 16 / 32 pairs on an H100).
  for rep in 1 2; do
    knob_sweep 64 "" causal_section_pairs=64 causal_section_pairs=128
    knob_sweep 192 "" causal_section_pairs=32 causal_section_pairs=64
  done
  stamp causal-sections41
  ;;
session39)
  # Session 39's half-form skip of the prologue's masked exponentials: its bitwise GPU tests, then
  # alternated with the planner's kernel (three pairs) on the short causal tile's S1024 rows; on an
  # H200 then the h200 mode's rows.
  gpu_tests skip-masked 200 180 4 'PrefillSkipMaskedGroupsGpu.*'
  for rep in 1 2 3; do
    for d in 64 128 192; do
      knob_sweep $d "" skip_masked_groups=2
    done
  done
  stamp skip-masked-halves
  ;&
row-sums)
  # Session 39's partial row sums: their GPU test, then 2 and 4 sums alternated with the planner's one
  # chain (three rounds) on the S1024 causal rows at d64/d128/d192 and d128 S4096; on an H200 then
  # the h200 mode's rows.
  if [ "$mode" = row-sums ]; then
    gpu_tests row-sum 200 180 4 'PrefillRowSumPartialsGpu.*'
    for rep in 1 2 3; do
      for d in 64 128 192; do
        knob_sweep $d "" row_sum_partials=2 row_sum_partials=4
      done
      for t in "" row_sum_partials=2 row_sum_partials=4; do
        run "d128 S4096" "$t" -b 4 -s 4096 --heads-q 32 -d 128 --variant fa3 --strict
      done
    done
    stamp row-sums
  fi
  ;&
ptxas)
  # Session 40's ptxas -O1 (ptxas_opt_level=1, ~70 ms less cold compile at d128): its GPU test, then
  # alternated with ptxas's default -O3 (three rounds) on issue 3's rows; on an H200 then the h200
  # mode's rows.
  # (session39 and row-sums fall through here to reach the h200 rows: only this mode runs it.)
  if [ "$mode" = ptxas ]; then
    gpu_tests ptxas-level 150 130 4 'PrefillPtxasOptLevelGpu.*'
    for rep in 1 2 3; do
      for d in 64 192; do
        knob_sweep $d "" ptxas_opt_level=1
      done
      for t in "" ptxas_opt_level=1; do
        run "d128 S4096" "$t" -b 4 -s 4096 --heads-q 32 -d 128 --variant fa3 --strict
        run "d256 S4096" "$t" -b 4 -s 4096 --heads-q 8 -d 256 --variant fa3 --strict
      done
    done
    stamp ptxas-level
  fi
  ;&
session38 | h200)
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  echo "gpu: $gpu" >>"$O/times.txt"
  on_h200=$(echo "$gpu" | grep -q H200 && echo 1 || echo 0)
  case $mode in session39 | row-sums | ptxas) [ "$on_h200" = 0 ] && exit 0 ;; esac
  if [ "$mode" = h200 ] && [ "$on_h200" = 0 ]; then
    # Another GPU: with a third argument `tests`, the GPU suite but decode's tests, without the parity
    # check (run 39b); otherwise only the tunings' softmax-form tests (~30 s).
    if [ "${3:-}" = tests ]; then
      timeout 260 bash scripts/gpu-check.sh "$O" --test-jobs=8 --test-timeout=230 --no-parity \
        --gtest-filter='-Decode*' >"$O/gpu-check.txt" 2>&1
    else
      timeout 120 bash scripts/gpu-check.sh "$O" --test-jobs=4 --test-timeout=100 --no-parity \
        --gtest-filter='PrefillSkipMaskedGroupsGpu.*:PrefillRowSumPartialsGpu.*:PrefillExpSubtractFirstGpu.*' \
        >"$O/gpu-check.txt" 2>&1
    fi
    stamp "tests rc=$?"
    exit 0
  fi
  if [ "$mode" = session38 ]; then
    # Session 37's last idea for the d64 short causal tile: fewer masked logits per diagonal block.
    for rep in 1 2; do
      knob_sweep 64 "" block_n=112 block_n=96
    done
    stamp d64-key-blocks
  fi
  if [ "$on_h200" = 1 ]; then
    # The H200 verdicts sessions 34-37 owe, the rows still open first, so a call cut short by its
    # time limit still brings them back: issue 3's open rows, the host's hot path (old, new), then the
    # rest of TARGETS.md's prefill rows.
    timeout 150 python3 bench/compare.py --lib build-device/libflashjit.so --out "$O/rows.json" --ops prefill \
      --prefill-rows d128s4096,d64s1024c,d192s1024c,d256s1024c,d256s4096 \
      2>&1 | grep -v "info: \(compil\|bundle\)" >"$O/rows.txt"
    stamp open-rows
  fi
  # The hot path's host time with session 38's cheaper validation and key-block choice, either GPU:
  # old, new, old, new in one process tree (build-device/old-lib: session 37's final libflashjit).
  builds=.
  [ -e build-device/old-lib/libflashjit.so.0 ] && builds="old-lib ."
  for rep in 1 2; do
    for build in $builds; do
      echo "== $build #$rep" >>"$O/host.txt"
      LD_LIBRARY_PATH=$PWD/build-device/$build:$PWD/build-device timeout 50 build-device/flashjit_host_bench \
        --benchmark_filter="forward_hot|raw_launch_fa3|launch_fa3_hot|resolve_hot|forward_fa2_hot|decode_forward_hot" \
        2>&1 | grep -E "forward|launch|resolve|decode" >>"$O/host.txt"
    done
  done
  stamp host
  if [ "$on_h200" = 1 ]; then
    timeout 250 python3 bench/compare.py --lib build-device/libflashjit.so --out "$O/rest.json" --ops prefill \
      --prefill-rows d64s4096,d64s16384c,d80s4096,d80s16384c,d96s4096,d128s1024,d128s16384c,d192s4096,d256s16384c \
      2>&1 | grep -v "info: \(compil\|bundle\)" >"$O/rest.txt"
    stamp other-rows
  fi
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
