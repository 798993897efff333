// Tuning knobs of the fa3 planner (compiler/plans/fa3_plan.cpp), for autotuning and A/B
// measurements; plan_fa3() (compiler/planner.hpp) uses the defaults.
#pragma once

#include "compiler/plan.hpp"

#include <string>

namespace flashjit {

// Tail split (kTailSplit): a tile is cut only where that shortens the longest walk by at least this
// many key blocks (runtime fa3_fill_tail); the planner builds specs whose tiles have no more than
// this many key blocks without the split (fa3_key_block_for).
constexpr int kFa3TailMinSavedBlocks = 8;

struct Fa3Tuning {
  int block_n = 0;              // 0: the planner's choice; else a multiple of 16 that must fit
  int pingpong = -1;            // -1: the planner's choice; 0 / 1 force it
  int exp2_poly_every = -1;     // -1: the planner's choice; 0: MUFU only; k: every k-th column group on FMA
  int consumer_warpgroups = 0;  // 0: the planner's choice; 2 (M = 128, 240 regs) or 3 (M = 192, 160 regs)
  int separate_o = -1;          // -1: the planner's choice; 1: O staged in its own smem, Q freed after the last QK
  int rescale_before_pv = -1;   // -1: the planner's choice; 1: rescale O between the QK and PV issues
  int cluster_m = 0;            // 0: the planner's choice; 1: one CTA per tile; 2: CTA pairs multicast K/V
  int lazy_rescale = -1;        // -1: the planner's choice; 1: raise the row max only by more than 2^8
  int lazy_top_rounding = -1;   // -1: the planner's choice (1 for varlen and paged specs, else 0); 1: with
                                // lazy_rescale, O normalized by the rounded top p
  int row_max_partials = 0;     // 0: the planner's choice; else 1, 2, 4 or 8 running maxima per row
  int row_sum_partials = 0;     // 0: the planner's choice (1); else 1, 2, 4 or 8 running sums per row
  int cross_tile_overlap = -1;  // -1: the planner's choice; 1: next tile's first QK with this tile's last PV
  int tail_split = -1;          // -1: the planner's choice; 1: the last waves' tiles split by keys (a workspace)
  int first_block_in_loop = -1; // -1: the planner's choice; 1: a tile's first block is the key loop's first step
  int q_desc_per_step = -1;     // -1: the planner's choice; 1: Q's wgmma descriptors rebuilt per k-step, 0: hoisted
  int q_in_registers = -1;      // -1: the planner's choice; 1: Q's A fragments in registers (RS QK), 0: from smem
  int desc_advance = -1;        // -1: the planner's choice; 1: a GEMM's wgmma descriptors advanced from its first by
                                // one add each, 0: each built from its shared-memory address
  int pingpong_softmax = -1;    // -1: the planner's choice (0); 1: with pingpong, the warpgroups take turns over their
                                // softmax (exponentials) instead of their GEMM issue
  int skip_masked_groups = -1;  // -1: the planner's choice (0); 1: the prologue block's softmax skips the exponentials
                                // of 16-column chunks the mask hides from every row of a warp (a branch per chunk),
                                // 2: of the block's second half where the mask hides it from the whole warp
  int early_qk_desc = -1;       // -1: the planner's choice (0); 1: the QK's first wgmma descriptors built before the K
                                // wait, so that they do not sit between the pingpong's hand-off and the first wgmma
  int turn_over_qk = -1;   // -1: the planner's choice (0); 1: with pingpong, a turn covers the QK issue only, the PV
                           // is issued after the hand-off (0: both GEMMs, FA-3's turn)
  int s_before_pv = -1;    // -1: the planner's choice (0); 1: a step waits for its S before it issues the PV, so that
                           // the softmax is not held back while the warpgroup's PV wgmmas queue for issue
  int exp_before_max = -1; // -1: the planner's choice (0); 1: a key-loop block's exponentials against the running max
                           // before it, the block's max checked after them (S recomputed where it rose too far)
  int exp_subtract_first = -1;  // -1: the planner's choice (0); 1: p = 2^((s - max) * c), an FADD and an FMUL, where 0
                                // takes one FFMA (s * c - max * c)
  int l2_promotion = -1;        // -1: the planner's choice; 0, 64, 128 or 256: bytes the TMA maps promote into L2
  int programmatic_launch = -1; // -1: the planner's choice; 1: launched as a programmatic dependent (PDL)
  int unmasked_key_loop = -1; // -1: the planner's choice; 1: no mask code below a tile's last block (no causal/window)
  int causal_sections = -1;   // -1: the planner's choice (0); causal walk: 0 by pairs, 1 one, 2 L2, 3 model
  int causal_section_pairs = 0; // 0: by causal_sections; else (batch, head) pairs per causal section (an A/B)
  int section_pairs = 0;        // 0: the planner's choice; else (batch, head) pairs per L2 section of an unmasked walk
  int paged = -1;               // -1: the planner's choice (fa3 reads K/V through the block table, but for the pages
                                // fa2_preferred_for_pages gives fa2); 0: fa2 for paged KV; 1: fa3 wherever it can run
  int paged_gather = -1;        // -1: cp.async gather where TMA boxes cannot tile the pages; 1 always, 0 never (an A/B)
  int stages = 0;               // 0: the planner's choice (2); 3 or 4: a deeper K/V ring (the key block shrinks to fit)
  int gather_noinc = -1;        // -1: the planner's choice (1); 1: a gather's copies arrive on the full barrier as they
                                // land (cp.async.mbarrier.arrive.noinc, as FA-3's paged path counts); 0: each block
                                // published after the next is issued (wait_group, the proxy fence, an arrival)
  int ptxas_opt_level = 0;      // 0: the planner's choice (ptxas's default, -O3); 1 or 2: a lower ptxas level, which
                                // compiles faster (NVRTC only; kPtxasOptLevel, kernel name `.oN`)
  int dynamic_tiles = -1;       // -1: the planner's choice (causal walks of contiguous K/V, except the short causal
                                // tile at d72-d128); 1: tiles drawn from a counter in the workspace as CTAs finish
                                // (kDynamicTiles; causal walks in L2 sections of kDrawnSectionPairs)
  int timeline = -1;            // -1 / 0: off; 1: a diagnostic build that records one CTA's cycle counter at each
                                // key-loop point (kTimeline, `.tl`; `flashjit bench --timeline`, bench/timeline.py)
};

// Why fa2 is preferred to fa3 for a paged spec on sm_90a (measured faster there), or "" where fa3 is:
// pages fa3 would gather, at head dims up to kMaxHeadDimFa2ForGatheredPages. `tuning` (may be null)
// paged=1 or paged_gather=1 keeps fa3 (an A/B).
std::string fa2_preferred_for_pages(const KernelSpec &spec, const Fa3Tuning *tuning);

bool plan_fa3_tuned(const KernelSpec &spec, const Fa3Tuning &tuning, Plan *plan, std::string *why_not,
                    flashjit_backend backend = FLASHJIT_BACKEND_AUTO);

// "key=value,..." with the keys block_n, pingpong, exp2_poly_every, consumer_warpgroups,
// separate_o, rescale_before_pv, cluster_m, lazy_rescale, lazy_top_rounding, row_max_partials, row_sum_partials,
// cross_tile_overlap, tail_split, first_block_in_loop, q_desc_per_step, q_in_registers, desc_advance, pingpong_softmax,
// early_qk_desc, turn_over_qk, s_before_pv, exp_before_max, exp_subtract_first, skip_masked_groups, l2_promotion,
// programmatic_launch, unmasked_key_loop, causal_sections, causal_section_pairs, section_pairs, paged, paged_gather,
// stages, gather_noinc, ptxas_opt_level, dynamic_tiles, timeline (the fields above; unnamed fields keep the planner's
// choice), e.g. "consumer_warpgroups=2,block_n=128": the developer override FLASHJIT_FA3_TUNING. False, naming the bad
// item, on an unknown key or a value that is not an integer; whether the values fit a spec is the planner's answer
// (plan_fa3_tuned).
bool parse_fa3_tuning(const std::string &text, Fa3Tuning *out, std::string *error);

} // namespace flashjit
