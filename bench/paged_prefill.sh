#!/usr/bin/env bash
# Paged prefill on the GPU machine: each shape through `flashjit bench` eight ways, the fa3 kernel on
# contiguous K/V (the planner's), fa3 through the block table with pages of 8, 16 and 64 keys in TMA
# boxes (FLASHJIT_FA3_TUNING=paged=1, strict: fa3 or an error), gathered by cp.async with pages of 1
# key and (paged_gather=1) of 16, and fa2 through the block table with pages of 16 and 1 (the
# planner's choice for pages fa3 would gather at head dims up to 64). One log line per run in
# RESULTS_DIR/paged-prefill.txt.
#   bench/paged_prefill.sh RESULTS_DIR      (uses $FLASHJIT_BUILD_DIR, default build-device)
set -uo pipefail
cd "$(dirname "$0")/.."
results="${1:?results directory}"
mkdir -p "$results"
cli="${FLASHJIT_BUILD_DIR:-build-device}/flashjit"
out="$results/paged-prefill.txt"
# batch seqlen_q seqlen_k heads_q heads_kv head_dim causal(0/1): chunked prefill (a chunk of new tokens
# against cache + chunk) and whole prompts.
shapes="4 2048 8192 32 8 128 1
4 4096 4096 32 8 128 1
4 4096 4096 16 16 128 0
8 1024 16384 32 8 64 1
2 4096 4096 16 16 256 1"
run() { # label, FLASHJIT_FA3_TUNING, then flashjit bench arguments
  local label="$1" tuning="$2"
  shift 2
  local line
  line=$(FLASHJIT_FA3_TUNING="$tuning" timeout 300 "$cli" bench -n 50 "$@" 2>&1 | grep -E "^(kernel|median)" |
    tr '\n' ' ')
  echo "$label: ${line:-failed}" | tee -a "$out"
}
while read -r b sq sk hq hkv d causal; do
  args=(-b "$b" -s "$sq" --seqlen-k "$sk" --heads-q "$hq" --heads-kv "$hkv" -d "$d")
  [ "$causal" = 1 ] && args+=(--causal)
  echo "== b$b sq$sq sk$sk h$hq/$hkv d$d causal=$causal" | tee -a "$out"
  run "fa3 contiguous" "" "${args[@]}" --variant fa3
  for page in 8 16 64; do
    run "fa3 page$page" paged=1 "${args[@]}" --page-size "$page" --variant fa3 --strict
  done
  run "fa3 page1 gathered" paged=1 "${args[@]}" --page-size 1 --variant fa3 --strict
  run "fa3 page16 gathered" paged=1,paged_gather=1 "${args[@]}" --page-size 16 --variant fa3 --strict
  run "fa2 page16" "" "${args[@]}" --page-size 16 --variant fa2
  run "fa2 page1" "" "${args[@]}" --page-size 1 --variant fa2
done <<<"$shapes"
