// Plan for the FlashAttention-3 kernel (templates/kernels/fa3_prefill.cuh) on sm_90a.
//
// CTA = 1 producer warpgroup (one thread issues every TMA) + 2 consumer warpgroups of 64 query
// rows each (kBlockM = 128), or 3 (kBlockM = 192) for head dims <= 96, odd multiples of 8 up to 120 and causal up to
// 128 (but paged KV with pages of whole 64-key boxes, kPagedWholeBlockKeys). K and V each get a 2-stage ring (the
// tuning `stages`, an A/B, deepens it); O is staged either in its own region or in Q's (see kMaxHeadDimSeparateO).
// Every operand tile is stored as 64-column panels of 128-byte rows with the 128B swizzle (what TMA writes and wgmma
// reads); head dims that are not a multiple of 64 round their *smem* width up to the next panel, while the QK reduction
// issues only ceil(d/16) k-steps and PV uses N = head_dim_v exactly. kBlockN is the largest multiple of 16 that fits
// both shared memory and the consumer register budget (S + P + O accumulators), capped at 128 for causal/local (finer
// diagonal granularity).
#include "compiler/plans/fa3_plan.hpp"
#include "compiler/planner.hpp"

#include <algorithm>
#include <charconv>
#include <iterator>
#include <numeric>
#include <string>
#include <utility>

namespace flashjit {
namespace {

constexpr int kWgmmaM = 64; // rows per consumer warpgroup (wgmma M)
constexpr int kConsumerWarpgroupsDefault = 2;
constexpr int kMaxConsumerWarpgroups = 3;
// Head dims (qk and v) up to this use 3 consumer warpgroups (kBlockM = 192, 160 registers each):
// the softmax (MUFU-bound, about as long as the GEMMs at d64) of two warpgroups then hides under
// the third's GEMMs. Measured on H200 (harness, bf16): d64 439 -> 512..524, d80 489 -> 547..557,
// d96 553 -> 599, causal S16384 d64 466 -> 500, d80 448..503 -> 512 TFLOP/s.
constexpr int kMaxHeadDimThreeWarpgroups = 96;
// Head dims that are odd multiples of 8 put every other head's K/V rows 16 bytes off a 32-byte
// sector, and a single CTA of two warpgroups (M = 128, 128 FLOPs per byte of K/V from L2) then
// loses 25-30%: d104 452 against d112's 647 (run 27c). Nsight Compute (run 28a): L2 84% busy for
// d104 against 70% for d112, which runs 40% faster. Halving the L2 traffic closes it:
// CTA pairs (kMinHeadDimClusterOddEights below) where the pairs can run, else three warpgroups (M = 192)
// up to this head dim: d104 S4096 449 -> 590, d120 576 -> 620 (session 23).
constexpr int kMaxHeadDimThreeWarpgroupsOddEights = 120;
// Causal tiles up to d128 too (M = 192, N = 80): d128 causal S16384 687 -> 699..701 TFLOP/s
// (harness, session 7, two rounds), where the unmasked d128 tile gains nothing (670 vs 670).
constexpr int kMaxHeadDimThreeWarpgroupsCausal = 128;
constexpr int kWarpgroupThreads = 128;
constexpr int kTailPieces = 2;     // a tile cut at a walker boundary has a piece on each side of it
constexpr int kRowsPerThread = 2;  // accumulator rows per thread of a wgmma m64 tile (softmax.cuh)
constexpr int kFloatVec = 4;       // floats per float4: the tail split's state moves in them (tail.cuh)
constexpr int kStagesDefault = 2;  // FA-3 uses 2 on sm_90 for every head dim
constexpr int kMaxStages = 4;      // tuning `stages`: deeper rings for the gather's copies (an A/B)
constexpr int kElemBytes = 2;      // fp16 / bf16
constexpr int kSwizzleBytes = 128; // one smem row of a panel; TMA + wgmma 128B swizzle
constexpr int kPanelCols = kSwizzleBytes / kElemBytes;
constexpr int kWgmmaSwizzle128 = 1;    // wgmma descriptor layout code of the 128B swizzle
constexpr int kTmaSwizzleAlign = 1024; // 8 rows x 128 B: a swizzle atom; tiles start on it
constexpr int kMbarrierBytes = 8;      // mbarriers at the end of smem, in kernels/fa3/smem.cuh's order:
constexpr int kFixedBarriers = 3;      // Q full, Q empty, paged V landed
constexpr int kBarriersPerStage = 4;   // K full, K empty, V full, V empty
constexpr int kBarrierRegionGranule = 128;
// kDynamicTiles: the producer hands tiles to the consumers through a ring of this many slots, each a
// full and an empty mbarrier and a 4-byte index (kernels/fa3/smem.cuh); two let it publish the next
// tile while the consumers still read the last. Tiles drawn from a counter (scheduler.cuh's TileFeed).
constexpr int kTileSlots = 2;
constexpr int kTileSlotBarriers = 2;
constexpr int kTileIndexBytes = 4;
// Causal walks draw their tiles by default (run 35b-c, H100, bf16, against the snake in one lease):
// d192 S1024 +11%, d192 S4096 +7.5%, d256 S1024 +3.3%, d128 S4096 +3%, d64 S1024 +1.7%. The short
// causal tile (kShortKeyBlock) from d72 to this head dim keeps the snake, which led by 0.8-1.0% at
// d96 and d128 S1024 (its walks are short, so the draw's hand-off costs more than the order gains).
constexpr int kMaxHeadDimSnakeShortCausal = 128;
// A causal walk of drawn tiles runs in L2 sections of this many (batch, head) pairs, each's m-blocks
// heaviest first (kDrawnSectionPairs, runtime/tma_desc.cpp); drawing evens the walkers' loads whatever
// the order, so the section serves L2 alone. Run 35b-c (H100, bf16; 1, 2, 4, 8, 16, 32, 64 pairs and
// one section): 16 led at d192 S1024 (433 TFLOP/s against 425 for 8, 421 for 32, 416 for 1 and 259 for
// one section), d192 S4096, d96 and d256 S1024 and tied 32 at d128 S1024 and S4096; at head dims up to
// kSmallHeadDim 32 led (d64 S1024: 326 against 323 for 16). Above kMaxHeadDimMidDrawnSections, walks of
// at most kMaxMBlocksShortDrawnWalk m-blocks a pair take kDrawnSectionPairsShortWalk (runs 43c-d, H100,
// bf16, d256 S1024: 32 pairs +0.6..2.8% in five rounds of five), longer ones keep 16 (d256 S4096 causal
// lost 1.5-1.9% in run 43e with 32), and d192 lost 2-4% with 32 at S1024 (run 43a).
constexpr int kDrawnSectionPairs = 16;
constexpr int kDrawnSectionPairsSmallDim = 32;
constexpr int kDrawnSectionPairsShortWalk = 32;
constexpr int kMaxHeadDimMidDrawnSections = 192;
constexpr int kMaxMBlocksShortDrawnWalk = 8;
constexpr int kKStep = 16;         // wgmma K for 16-bit inputs
constexpr int kBlockNGranule = 16; // PV reduces over kBlockN in k-steps of 16
constexpr int kMaxBlockN = 192;
constexpr int kMaxBlockNSmallDim = 224; // dv <= 64: fewer, longer iterations measured +3% at d64
constexpr int kSmallHeadDim = 64;
// Q's A fragments in registers for the short causal tile at head dims up to kSmallHeadDim (its QK
// an RS wgmma): the d64 S1024 causal row with drawn tiles, +1.5% bf16 in ten alternated pairs and
// +1.2% fp16 in three, on an H100 (runs 36c-d); measured at d64 only, the smaller dims share its
// kernel's shape.
constexpr bool kQInRegistersShortCausalSmallDim = true;
// A GEMM's wgmma descriptors: the first built from its shared-memory address, the others advanced
// from it by one add (kDescAdvance), or each built from its own address (a shift, a mask and an or
// more per wgmma on the uniform datapath). Template form only. Runs 37e-f (H100, alternated pairs):
// d128 S4096 +0.7% (5 of 5), d128 S4096 causal +0.9%, d256 / d192 S1024 causal +1.4% / +0.6%, d64
// and d80 / d96 S4096 within ±0.3%; but the short causal tile (kShortKeyBlock) lost: d64 -1.2% (5 of
// 5), d96 -0.9%, d128 -0.4%, so it keeps the built descriptors.
constexpr bool kDescAdvanceDefault = true;
// What the pingpong's turn covers: each warpgroup's GEMM issue (FA-3's order: one warpgroup's
// softmax under the other's GEMMs), or its softmax (cuDNN's order in the session 36 profile: the
// exponential phases never overlap on MUFU, the GEMMs queue as issued). Template form only.
constexpr bool kPingpongSoftmaxDefault = false;
// Where a QK's first wgmma descriptors are built: after the pingpong's turn barrier, where ptxas puts
// them when the source does (a dozen uniform-datapath instructions between the hand-off and the
// warpgroup's first wgmma in the d128 S4096 kernel), or before the K wait (kEarlyQkDesc, session 44:
// seven; six at d192 / d256 causal). Template form only. Run 44c (H100, three alternated rounds): d128
// S4096 -0.2..-1.1% in all six readings, the other pingpong rows within noise, so off.
constexpr bool kEarlyQkDescDefault = false;
// What a GEMM-phase pingpong turn holds: the QK and the PV issue (FA-3's turn), or the QK only
// (kTurnOverQk, session 44), so that the other warpgroup's QK may reach the tensor cores before this
// one's PV and the V wait never holds the turn. Template form only. Run 44c (H100): d64 S1024 causal
// -10%, the other pingpong rows within +-1.6%, so off.
constexpr bool kTurnOverQkDefault = false;
// When a step's S is awaited: after the PV's wgmmas are issued (FA-3's order), or between the QK and the PV
// issue (kSBeforePv, session 46). Run 46a's timeline (d128 S4096, H100) has a warpgroup's last wgmma issued
// ~300 cycles after its QK would have finished on an idle pipe: the wgmma queue accepts about eight, so
// the PV's issue blocks the softmax's start. Template form only. Run 47a (H100): bit for bit the
// default's output, but 15-19% slower at d128 S4096 (the turn is held through the QK, so the pipe drains
// at every turn) and 2-3% at d192 S1024 causal and d256 S4096, so off.
constexpr bool kSBeforePvDefault = false;
// When a key-loop block's exponentials start: after its row max (FA-3's order), or against the running
// max before the block, the block's max checked after them (kExpBeforeMax, session 47; a recompute of S
// where it rose by more than the jump below). ptxas puts all of a d128 block's 84 FMNMX and both quad
// shuffles before its first MUFU; run 47b's timing build without that wait (wrong output, a bound) was
// 1.6-3.1% faster at d128 S4096 and 2.3-2.7% at d64 S1024 causal, level at d192 S1024 causal and d256.
// Template form only; not yet timed in its correct form.
constexpr bool kExpBeforeMaxDefault = false;
// How far (exp2 units) a block may raise a row's max above the reference its exponentials took: p is
// then at most 2^jump, inside fp16's range (65504) at 15 and far from overflowing O's fp32 at 64.
constexpr int kExpJumpLog2Fp16 = 15;
constexpr int kExpJumpLog2Bf16 = 64;
// The exponent of p: s * c - max * c as one FFMA, or (s - max) * c as an FADD and an FMUL (cuDNN's
// form in the session 36 profile, which spreads the MUFU issue). Template form only.
constexpr bool kExpSubtractFirstDefault = false;
// The prologue block's softmax (the tile's diagonal block under causal masking) without exponentials
// for the 16-column chunks that the mask hides from every row of a warp: at d64, where MUFU time
// matches the GEMMs', a causal S1024 tile spends about a fifth of its exponentials on its diagonal
// block and nearly half of those on masked logits. Two forms (templates/kernels/fa3/softmax.cuh): a
// warp-uniform branch per 16-column chunk and row, or one branch between the block's softmax over all
// columns and over the first half only. Template form only.
constexpr int kSkipMaskedNone = 0;
constexpr int kSkipMaskedHalf = 2;     // softmax.cuh's forms: kSkipMaskedBranch 1, kSkipMaskedHalf 2
constexpr int kGroupsPerSkipChunk = 2; // 16 columns a branch (kBlockNGranule: they tile every key block)
constexpr int kSkipMaskedGroupsDefault = kSkipMaskedNone;
constexpr int kMaxBlockNMasked = 128; // causal / local
constexpr int kMinHeadDim = 8;
constexpr int kMaxHeadDim = 256; // one wgmma N
constexpr int kHeadDimGranule = 8;
constexpr int kRowsPerTmaBox = 64; // Q / O boxes cover one consumer warpgroup's rows
constexpr int kMaxPingpongHeadDim = 128;
// Exponentials on the FMA pipe (every k-th 8-column group; 0 = all on MUFU). Measured on H200:
// +2.4% at d64 with N=192 (k = 4) but none on top of N=224 (441 vs 445 TFLOP/s), -3..-4% at
// d96/d128, so it is off by default and left as a tuning knob. Run 26e, with today's three-warpgroup
// tiles (d64 m192n128, d80 m192n112): every 8th group −2.4..−4.9%, every 4th −10.5%, every 2nd −20%.
constexpr int kExp2PolyEverySmallDim = 0;
// Running maxima per row in the softmax (kRowMaxPartials, interleaved over the block's column
// groups of kColsPerGroup columns, then a tree). Runtime A/B, one lease, bf16 (perf-notes,
// session 8): 4 instead of one chain gains +1.1% at d128 S4096, +2.2% at d128 S1024, +1.2% at d256
// (all two consumer warpgroups), and loses 1.3% at causal d128, 0.4% at d64 (three warpgroups,
// where each softmax already hides under two GEMMs).
constexpr int kRowMaxPartialsTwoWarpgroups = 4;
// Running sums per row (kRowSumPartials, interleaved over the block's logits, then a tree): the
// dependent FADD chain of the row sum is kBlockN / 4 / kRowSumPartials long. Template form only.
constexpr int kRowSumPartialsDefault = 1;
constexpr int kRowMaxPartialsThreeWarpgroups = 1;
constexpr int kColsPerGroup = 8; // accumulator columns of one wgmma n8 group (softmax.cuh)
// ptxas's optimization level. Of the d128 S4096 kernel's ~0.95 s cold compile, ptxas takes ~0.46 s
// at its default -O3 and ~0.39 s at -O1 (NVRTC --time, session 40), but -O1 costs the short causal
// tiles 4-9% on the H200 (run 41b: d64 S1024 −8.6%, d192 −3.7%), so ptxas's default stays.
constexpr int kPtxasOptLevelDefault = 3;
// Cross-tile overlap (kCrossTileOverlap): the next tile's first QK is issued with this tile's last
// PV and the epilogue runs under it (consumer.cuh). Needs the separate O region; NVRTC only (the
// MLIR generator renders one tile at a time). Predicted +4..8% at d128 S1024; measured (session 8,
// runtime A/B, bf16) 3-7% *slower* at every head dim it applies to (d128 S1024 -6.6%, S4096 -2.6%,
// causal -6.0%, d64..d96 -3..-6%): off; a tuning for further work.
constexpr bool kCrossTileOverlapDefault = false;
// Tail split, measured in session 10 (runtime A/B, bf16, S4096, against whole tiles): +5.1% d64, +2.1%
// d80 (three consumer warpgroups); +1.3% d128, +1.4% d192, +0.1% d256 (two), where it then pushed
// the cold compile past 1.0 s (1.1-1.2 s); -4.4% at d128 S1024, so short walks keep whole tiles
// (runtime/tma_desc.cpp, fa3_fill_tail). Session 14 (run 18b, bf16 / fp16): two warpgroups gain
// +1.7 / +1.8% at d128 S4096 but only +0.5..0.6% at d192 and +0.3% at d256, and the split kernels
// compile in 0.84-0.90 s up to d128 (0.92-0.98 s above). So: three warpgroups, and two up to
// kMaxHeadDimTailSplitTwoWarpgroups with the default key block (the short one spills 4 B with the
// split, and its walks are too short to cut).
constexpr bool kTailSplitDefault = true;
constexpr int kMaxHeadDimTailSplitTwoWarpgroups = 128;
// A tile's first key block as the key loop's first step, which issues no PV (kFirstBlockInLoop),
// instead of a prologue of its own: the softmax is compiled once, not twice. Measured on the H200
// (runs 23b-c, runtime A/B against the prologue form): +1.1..1.3% at d192 and d256 non-causal in
// bf16 and fp16, the kernels without pingpong; 1-7% slower on every kernel with pingpong (d64..d128,
// causal). So the default without pingpong only. With pingpong, neither an unconditional first-step
// rescale (run 23d: 0-3% slower) nor the PV wait before the softmax (run 24a: 1-5.5% slower)
// closed the loss. Cold compile: the NVVM optimizer's share falls by ~25%. One tile at a time only;
// NVRTC only (the MLIR generator renders its own loop). Run 25 (session 21): the prologue form with
// the unmasked key loop (below) is +3.0% at d192 and +0.5% at d256 against it, so no default uses it.
constexpr bool kFirstBlockInLoopWithoutPingpong = false;
// Launched as a programmatic dependent (kProgrammaticLaunch, PDL): the kernel's prologue (barrier
// init, descriptor prefetch, cluster sync) runs while the previous grid of the stream drains, every
// thread waits (griddepcontrol.wait) before it touches global memory, and the next grid may be
// scheduled on the SMs this one frees. Measured on the H200 (run 24f, runtime A/B): +0.2..0.4% on
// d64, d128 S1024/S4096 and d256, within the A/B's noise, so off by default (a tuning).
constexpr bool kProgrammaticLaunchDefault = false;
// Without causal or window masking, only a tile's last key block can hold keys past seqlen_k, and the
// prologue form computes that block before the key loop: the loop then needs no mask code at all
// (kUnmaskedKeyLoop). Measured on the H200 (run 25b, runtime A/B against the loop with the mask,
// bf16): +2.8..2.9% at d128 S4096, +1.6% at S1024, +1.1..1.3% at d80, d64 and d96 within ±0.6%; and
// with it the prologue form beats `.fl` at d192/d256 (run 25d). Both backends render it; the MLIR
// kernels gain with it too (run 26b, their speed against the same NVRTC kernels, bf16): d128 S4096
// +7.6%, S1024 +4.9%, d192 +4.7%, d256 +3.9%, d64/d80 +1.3%/+1.2%, d96 +0.3%.
constexpr bool kUnmaskedKeyLoopDefault = true;
// Q's wgmma descriptors, one per k-step of the QK GEMM, are the same for every key block; hoisted
// out of the key loop (the compiler's choice) they outnumber the uniform registers from d ~192 on,
// so ptxas parks them in ordinary registers and moves each back (R2UR) before its GEMM. kQDescPerStep
// rebuilds them per step from one base the compiler cannot hoist (consumer.cuh issue_qk): no R2UR
// in any GEMM group, and d128 N160 / d192 / d256 compile in 0.82-0.86 s instead of 0.96-1.0 s. The
// runtime A/B (session 10, bf16, against the hoisted form) is within its noise: d128 S4096 +1.6%,
// d192 -0.1%, d256 -0.5%, d256 causal -1.1%, d64 -1.9% (no R2UR there either way). Used with two
// consumer warpgroups, where it buys the compile time; three keep the hoisted form.
// Register split (setmaxnreg), per thread of each warpgroup: 2 consumer warpgroups:
// 128 * (24 + 2 * 240) = 64,512; 3: 128 * (32 + 3 * 160) = 65,536 <= 64K registers per SM.
constexpr int kRegsProducer2 = 24;
constexpr int kRegsConsumer2 = 240;
constexpr int kRegsProducer3 = 32;
constexpr int kRegsConsumer3 = 160;
// Registers per consumer thread that addresses, row statistics and loop state take; the rest
// holds S (kBlockN/2 f32), P (kBlockN/4 b32) and O (dv/2 f32). With 160 registers ptxas packs
// tighter: d64 N=128 compiles without spills, d80 N=128 spills 48 bytes (so d80 gets 112).
constexpr int kConsumerRegOverhead2 = 40;
constexpr int kConsumerRegOverhead3 = 32;
// Separate O region (kSeparateO) by default for 3 consumer warpgroups and for unmasked 2-warpgroup
// tiles up to d128 (measured: d128 642 -> 660 at S4096, 521 -> 534 at S1024, despite N 176 -> 160;
// causal d128 620 vs 622, neutral, so masked 2-warpgroup tiles keep the larger N budget).
constexpr int kMaxHeadDimSeparateO = 128;
// CTA pairs (thread-block clusters of 2 along M): the two CTAs of a pair take adjacent m-blocks of
// one (batch, head), so every K/V block is read from L2 once per pair and multicast to both (each
// CTA loads half the block's rows). At M = 128 a CTA does 4 * 128 * N * d FLOPs per 4 * N * d bytes
// of K/V, 128 FLOPs per byte: at 700 TFLOP/s that is ~5.5 TB/s of L2->SM traffic, near what L2
// delivers, so halving it is FA-3's remedy for head dims >= 128 (ClusterM = 2 there). Every CTA of a pair must walk the
// same KV blocks, so pairs are used only where all m-blocks see all keys: no causal / window mask,
// no varlen (a pair could straddle two sequences).
constexpr int kClusterPair = 2;
constexpr int kMinHeadDimCluster = 128;
// Odd multiples of 8 from d72 run in pairs too (run 28b/c, bf16, planner's kernel -> pairs):
// d104 two warpgroups S4096 556 -> 570, S1024 457 -> 519 (x1.14 cuDNN); d120 S4096 566 -> 614, S1024 475
// -> 556 (x0.88 -> x1.03 cuDNN); three warpgroups d72 S4096 +0.8%, S1024 +5.7%, d88 +0.5% / +4.0%.
// d40 and d56 lose 1.5-2.4% (their softmax, not L2, binds them): single CTAs there.
constexpr int kMinHeadDimClusterOddEights = 72;
// The key block for short key lengths that the default (larger) block pads badly: S = 1024 at d128
// is 6.4 blocks of 160, so the 7th block is 40% padding. Measured (harness, bf16, CTA pairs, session
// 7, two rounds): d128 S1024 562 -> 587..588 TFLOP/s with N 128, but S4096 672 -> 665 (a 128-key
// block costs ~1% more per key; 2% with single CTAs, session 3). fa3_key_block_for takes the short
// block when its padded keys, charged 2% more per key, are fewer than the default block's.
constexpr int kShortKeyBlock = 128;
constexpr int kShortKeyBlockCostNumer = 102; // cost per key of the short block, against
constexpr int kShortKeyBlockCostDenom = 100; // the default block's

// The short causal tile (kMaxSeqlenShortCausal): a masked spec given the short key block, which
// takes two warpgroups whatever the head dim.
bool short_causal_tile(const KernelSpec &spec) {
  return (spec.causal || spec.local) && spec.key_block == kShortKeyBlock;
}

// The two-warpgroup tiles of 112-key blocks (unmasked d136..d192 in CTA pairs) take 96-key blocks
// where they pad less: S1024 is 9.1 blocks of 112 (1120 keys computed), 10.7 of 96 (1056). Measured
// (bf16, d192 S1024, N112 -> N96): +2.5% (run 28b), +2.7% (runs 29a, 29b), fp16 +2.8% (29b): a 96-key
// block costs ~3% more per key. NVRTC plans only (measured with the templates).
constexpr int kNarrowedKeyBlockFrom = 112;
constexpr int kNarrowKeyBlock = 96;
constexpr int kNarrowKeyBlockCostNumer = 103;
// Causal sequences up to this length take the short-sequence tile instead of three consumer
// warpgroups: the same key block (spec.key_block = kShortKeyBlock) with two warpgroups (M = 128) and
// O in its own region. At S1024 M = 192 runs 5.33 m-blocks whose last, the heaviest, is a third full.
// Measured (runs 28c-d, bf16, causal, B*S = 16384): d128 S1024 374 -> 411 TFLOP/s (with L2 sections),
// d64 S1024 297 -> 317; but d128 S2048 542 -> 481.
constexpr int kMaxSeqlenShortCausal = 1024;
// Lazy O rescale (templates/kernels/fa3/softmax.cuh, kLazyRescaleLog2): the row max moves only by
// more than 2^8, so most blocks skip the O FMULs. Measured on H200 (harness, session 7, two rounds):
// d256 S4096 (no pingpong: the softmax is on the warpgroup's own path) 757 -> 775, d80 (3
// warpgroups) 571 -> 583, but d64 537 -> 528, d128 678 -> 668, d128 causal 696..701 -> 691..716.
// On by default where it gained: tiles without pingpong (d192 by extension) and 3-warpgroup
// head dims 72..80; causal 3-warpgroup tiles from d72 up (run 29g, bf16 / fp16, eager -> lazy: d128
// S2048..S16384 +3.0..4.0%, d96 S4096 +1.2%, but d64 S4096/S16384 -0.5..0%, and the two-warpgroup
// short causal tile -1%). Session 7's d128 causal reading (696..701 -> 691..716) was one-section walks.
// Plain lazy rescaling on fixed lengths only (varlen and paged take the top rounding below): an unmasked d64 varlen
// case with lazy rescaling failed the float64 rule (O 0.0072 > 0.0052, run 29j), no varlen case had run lazily on the
// GPU before, and the failing row is a peaked one (the eager kernel's worst element on the same inputs, run 29h, is in
// it too): with a stale max the row's dominant p is 2^d, which a 16-bit P rounds, where eager keeps it
// exactly 1. The lazy kernels' max |O - cuDNN's O| is twice the eager ones' (0.0039 -> 0.0078 at d128
// causal, run 29g); the fixed-length lazy kernels pass every GPU case, the sharp-logit ones included.
// Lazy rescaling's top rounding (softmax.cuh, kLazyTopRounding): O normalized by a sum that counts
// each block's largest p as the 16-bit P that weighted V. The CPU model of the kernel's arithmetic
// (session 26) reproduces run 29j's GPU errors exactly (lazy 0.00725 against eager 0.00191 on the
// failing case's inputs, naive 0.00262) and brings lazy to 0.00273 with it; on peaked rows (scale
// 1.5, d80) it returns lazy's error to eager's. Run 31 checked it on the H200 (the peaked rows read
// the model's values exactly) and timed it at -0.4..-2.6% against plain lazy on fixed lengths, which
// stay `.lz`. Varlen and paged specs, which rescaled eagerly (run 29j), now rescale lazily with it
// wherever a fixed-length spec rescales lazily: run 32a (bf16, paged, eager -> `.lzt`) d128 causal
// three warpgroups 558 -> 581 (+4%), d256 unmasked 588 -> 627 (+7%; N64 697 -> 732), d80 causal
// chunked +1..2%; varlen without pages reads the same kernels but for the K/V addresses.
constexpr bool kLazyTopRoundingFixedLengths = false;
constexpr bool kLazyTopRoundingVaryingLengths = true;
constexpr int kMinHeadDimLazyRescale3Wg = 72;
constexpr int kMaxHeadDimLazyRescale3Wg = 80;
// Causal pingpong tiles rescale lazily from this head dim (H100, eager -> lazy, three alternated rounds
// each: d256 S1024 causal +0.2..1.2% and S16384 +0.5..2.3%, beside cuDNN +1.4% / +1.8% at S1024 and
// +2.5% at S16384, bf16 / fp16, runs 43c-d; d192 S1024 causal +0.1..1.7% in nine rounds, S4096
// +0.9..1.8% in six, runs 43e-g).
// The d128 short causal tile lost 1% (run 29g).
constexpr int kMinHeadDimLazyRescalePingpongCausal = 192;
// Bytes the TMA maps promote into L2 per miss (runtime/tma_desc.cpp; Fa3Tuning::l2_promotion A/Bs
// it). 256 since the first fa3 kernel; the decode maps measured 256 at 6-9% below 0/64/128 (run 22d).
constexpr int kTmaL2PromotionBytes = 256;
// Walk order of causal tiles (kCausalSections, read by fa3_fill_schedule in runtime/tma_desc.cpp):
// 0 (the default): one section over every (batch, head) pair, heaviest m-blocks first across the
// whole grid, where each wave holds several tiles of every pair (their CTAs then read the same K/V
// blocks at about the same time); otherwise sections whose K/V fit in L2 and hold a whole number of
// waves of tiles (or, where a model of the walk puts those below 0.95 of even, the L2 section it
// prefers), and where no such section fits, the model's L2 section if it is that even and the
// sequence has at most 32 m-blocks, else one section (runtime/tma_desc.cpp says why).
// 1: one section always (the order of sessions 6-23). 2: L2 sections always (of whole waves where
// they fit, else a power of two of pairs). 3: as 0, but always the L2 section the model of the walk
// prefers (fa3_causal_walk_balance). Fa3Tuning::causal_section_pairs forces a section size (A/Bs).
// Why (run 28d, bf16, one section -> L2 sections): d128 S2048 505 -> 542, S4096 583 -> 595, d64 S4096
// 456 -> 472 TFLOP/s, where one section brings a pair's next m-block 64-256 tiles later and its K/V
// back from DRAM (d128 S1024: 3.4 TB/s of DRAM traffic at a 32% L2 hit rate, run 28c); but d128
// S16384 664 -> 584 and d256 S16384 771 -> 474, with 16 and 8 pairs.
constexpr int kCausalSectionsByPairs = 0;
constexpr int kCausalSectionsMax = 3;
// Paged KV (kPageSize > 0): each K/V block lands as boxes of kPagedBoxRows keys of one page, the
// largest that divides both the page and the block, so every box starts on a swizzle atom (8 rows
// of 128 bytes) and lies in one page. Pages that are not a multiple of 8 keys (e.g. SGLang's single
// tokens) cannot be tiled so: the producer warpgroup gathers their rows by cp.async instead
// (kPagedGather, FA-3's non-TMA paged path), 16 bytes per thread and copy.
constexpr int kMinPagedBoxRows = kTmaSwizzleAlign / kSwizzleBytes;
// The default since run 31 (session 28): both forms pass the GPU tests (PrefillFa3PagedGpu, bitwise
// equal to the unpaged varlen kernel) and compute-sanitizer. The boxes run 2.1-3.1x fa2's paged
// kernel (d64, d128, d256; 6-19% below contiguous K/V at 16-64-key pages), the gather 1.9-2.5x at
// d128/d256 but only level with fa2 at d64 (one-key pages, chunked prefill: 111 against 107
// TFLOP/s; since session 32 fa2 is preferred there, kMaxHeadDimFa2ForGatheredPages).
// FLASHJIT_FA3_TUNING=paged=0 keeps fa2 (an A/B).
constexpr bool kPagedDefault = true;
// The gather's copies arrive on their block's full barrier as they land (kGatherNoincArrive,
// cp.async.mbarrier.arrive.noinc; FA-3's non-TMA paged path counts arrivals so) rather than each block
// being published after the next is issued (wait_group, the proxy fence, an arrival). Default since
// session 32: bit for bit the fenced gather on every GPU case (PrefillFa3PagedGpu), MEMBARs per kernel
// 11 -> 1, and as fast or faster on run 33's H100 (bf16, one-key pages, chunked prefill): d64 -0.4..+1%,
// d80 +3.3%, d96 +5.6%, d128 +5.8%; d128 causal 4x4096 +4.9%; 16-key pages gathered +6.3%.
constexpr bool kGatherNoincDefault = true;
// Pages fa3 must gather, at head dims up to this: fa2's paged stream runs them faster (run 33e, H100,
// bf16 chunked prefill 8x1024 over 16384 keys, one-key pages: d64 fa2 136.6 against the gather's
// 112.8 TFLOP/s; from d80 the gather leads, 118.6 against 105.9).
constexpr int kMaxHeadDimFa2ForGatheredPages = 64;
// Paged key blocks of whole pages: with pages of a multiple of kPagedWholeBlockKeys keys, the key block
// is rounded down to a multiple of it, so each block lands as one or two 64-row boxes per panel
// instead of 16-row ones (the boxes' count, not their bytes, is what paged blocks cost: run 31), and
// the causal tiles that take three warpgroups only for d97..d128 take two (N128; three fit N64 only).
// Measured on the H200 (run 32a, bf16, pages of 64 keys, default tile -> whole pages): d128 causal
// 4x4096 558 -> 628..632 (two warpgroups N128; three N64 589 in run 31c), d256 unmasked 588 -> 697
// (N80 -> N64), d256 causal 554 -> 608, d80 causal chunked 271 -> 283; d128 unmasked pages of 128
// 657 -> 674 (N160 -> N128, run 31c +2.6%). Run 33 (H100): d192 N112 -> N64 +8.1% unmasked, +7.3%
// causal; but d96 N96 -> N64 -4.8% unmasked. N96 already lands in 32-row boxes (3 a panel, not 7 as
// N112 and N80 do) and rounding it to 64 drops a third of its keys: a default block whose boxes are
// kPagedWholeBlockTallBoxRows or taller keeps its size unless whole pages keep at least
// kPagedWholeBlockKeptNum / kPagedWholeBlockKeptDen of its keys (N160 -> N128 does). So d96 and d104
// keep N96; d112/d120 and d128 (N128), d80, d192 and d256 (N64) take whole pages.
constexpr int kPagedWholeBlockKeys = 64;
constexpr int kPagedWholeBlockTallBoxRows = 32;
constexpr int kPagedWholeBlockKeptNum = 3, kPagedWholeBlockKeptDen = 4;
// Named barriers: 0 is __syncthreads; then one pingpong barrier and one epilogue barrier per
// consumer warpgroup.
constexpr int kBarrierPingpong = 1;

int round_up(int value, int multiple) {
  return (value + multiple - 1) / multiple * multiple;
}
int round_down(int value, int multiple) {
  return value / multiple * multiple;
}

// Bytes of the mbarrier region of a ring of `stages` slots (and the tile ring of kDynamicTiles).
int barrier_bytes(int stages, bool dynamic_tiles) {
  const int tile_ring = dynamic_tiles ? kTileSlots * (kTileSlotBarriers * kMbarrierBytes + kTileIndexBytes) : 0;
  return round_up(kMbarrierBytes * (kFixedBarriers + kBarriersPerStage * stages) + tile_ring, kBarrierRegionGranule);
}

// The warpgroup count, O staging and key block of a spec: the part of the plan that the per-call
// key-block choice (fa3_key_block_for) needs too, so it allocates nothing unless it refuses.
struct Fa3Tile {
  int stages = 0;
  int consumer_wgs = 0;
  int block_m = 0;
  int block_n = 0;
  bool masked = false;
  bool separate_o = false;
  int qk_smem_cols = 0;
  int v_smem_cols = 0;
  int q_bytes = 0;
  int o_bytes = 0;
  int qo_bytes = 0;
  int smem_limit = 0;
};

// Whether the sequences of a problem may differ in length: varlen, or paged KV (seqlens_k).
bool lengths_vary(const KernelSpec &spec) {
  return spec.varlen || spec.page_size != 0;
}

// CTA pairs need every m-block to see every key (no causal / window mask, no varlen: a pair could
// straddle two sequences; no paged KV: its blocks land in page-sized boxes per CTA); the MLIR
// generator renders single-CTA tiles only.
bool fa3_pairs_can_run(const KernelSpec &spec, flashjit_backend backend) {
  return !spec.causal && !spec.local && !lengths_vary(spec) && backend != FLASHJIT_BACKEND_MLIR;
}

// Whether the planner's tile splits its last waves by keys (kTailSplit) when no tuning says otherwise:
// where that was measured faster, for specs of any key length (key_block 0; a short sequence's spec
// names its key block: its units are too short to split, fa3_key_block_for).
bool tail_split_by_default(const KernelSpec &spec, const Fa3Tile &t, flashjit_backend backend) {
  const bool three_wgs = t.consumer_wgs == kMaxConsumerWarpgroups;
  const int max_dim = std::max(spec.head_dim_qk, spec.head_dim_v);
  return kTailSplitDefault && spec.key_block == 0 && (three_wgs || max_dim <= kMaxHeadDimTailSplitTwoWarpgroups) &&
         !t.masked && !lengths_vary(spec) && !kCrossTileOverlapDefault && backend != FLASHJIT_BACKEND_MLIR;
}

// Whether a paged spec's K/V rows are gathered by cp.async (kPagedGather) rather than loaded in TMA
// boxes: pages that boxes of whole swizzle atoms cannot tile, unless a tuning says otherwise.
bool pages_gathered(const KernelSpec &spec, const Fa3Tuning &tuning) {
  return spec.page_size != 0 &&
         (tuning.paged_gather >= 0 ? tuning.paged_gather != 0 : spec.page_size % kMinPagedBoxRows != 0);
}

bool fa3_odd_eights(const KernelSpec &spec) {
  return spec.head_dim_qk % kKStep != 0 || spec.head_dim_v % kKStep != 0;
}

bool fa3_tile(const KernelSpec &spec, const Fa3Tuning &tuning, flashjit_backend backend, Fa3Tile *tile,
              std::string *why_not) {
  auto refuse = [&](const std::string &reason) {
    if (why_not)
      *why_not = reason;
    return false;
  };
  if (spec.op != Op::prefill)
    return refuse("fa3 implements prefill only");
  if (spec.arch.sm != 90 || !spec.arch.arch_specific)
    return refuse("fa3 needs sm_90a (wgmma, setmaxnreg)");
  if (spec.page_size != 0) {
    if (backend == FLASHJIT_BACKEND_MLIR)
      return refuse("fa3 paged KV has a template form only (NVRTC)");
    if (spec.page_size % kMinPagedBoxRows != 0 && tuning.paged_gather == 0)
      return refuse("fa3 paged KV in TMA boxes needs pages of a multiple of " + std::to_string(kMinPagedBoxRows) +
                    " keys (paged_gather=0 rules out the gather), got page_size " + std::to_string(spec.page_size));
    if (!(tuning.paged >= 0 ? tuning.paged != 0 : kPagedDefault))
      return refuse("fa3 paged KV is turned off by the tuning paged=0");
  }
  if (spec.align_bytes % 16 != 0)
    return refuse("fa3 needs 16-byte aligned rows (TMA strides)");
  for (int dim : {spec.head_dim_qk, spec.head_dim_v})
    if (dim < kMinHeadDim || dim > kMaxHeadDim || dim % kHeadDimGranule != 0)
      return refuse("fa3 head dims must be multiples of 8 in [8, 256], got " + std::to_string(dim));

  Fa3Tile &t = *tile;
  t.stages = tuning.stages != 0 ? tuning.stages : kStagesDefault; // 0: untuned; the check refuses the rest
  if (t.stages < kStagesDefault || t.stages > kMaxStages)
    return refuse("fa3: stages must be 2 to " + std::to_string(kMaxStages) + ", got " + std::to_string(t.stages));
  if (tuning.skip_masked_groups < -1 || tuning.skip_masked_groups > kSkipMaskedHalf)
    return refuse("fa3: skip_masked_groups must be 0 (off), 1 (chunks) or 2 (halves), got " +
                  std::to_string(tuning.skip_masked_groups));
  if (tuning.gather_noinc < -1 || tuning.gather_noinc > 1)
    return refuse("fa3: gather_noinc must be 0 or 1, got " + std::to_string(tuning.gather_noinc));
  if (t.stages != kStagesDefault && backend == FLASHJIT_BACKEND_MLIR)
    return refuse("fa3: stages other than 2 have a template form only (NVRTC)");
  t.masked = spec.causal || spec.local;
  const int max_dim = std::max(spec.head_dim_qk, spec.head_dim_v);
  const bool small_dim = max_dim <= kSmallHeadDim;
  const bool short_causal = short_causal_tile(spec);
  const bool whole_pages =
      spec.page_size != 0 && spec.page_size % kPagedWholeBlockKeys == 0 && !pages_gathered(spec, tuning);
  const bool fits_three_wgs =
      !short_causal &&
      (max_dim <= kMaxHeadDimThreeWarpgroups ||
       (fa3_odd_eights(spec) && max_dim <= kMaxHeadDimThreeWarpgroupsOddEights && !fa3_pairs_can_run(spec, backend)) ||
       (spec.causal && !spec.local && max_dim <= kMaxHeadDimThreeWarpgroupsCausal && !whole_pages));
  t.consumer_wgs = tuning.consumer_warpgroups > 0 ? tuning.consumer_warpgroups
                   : fits_three_wgs               ? kMaxConsumerWarpgroups
                                                  : kConsumerWarpgroupsDefault;
  if (t.consumer_wgs < kConsumerWarpgroupsDefault || t.consumer_wgs > kMaxConsumerWarpgroups)
    return refuse("fa3: 2 or 3 consumer warpgroups");
  const bool three_wgs = t.consumer_wgs == kMaxConsumerWarpgroups;
  t.block_m = kWgmmaM * t.consumer_wgs;
  const int regs_consumer = three_wgs ? kRegsConsumer3 : kRegsConsumer2;
  t.qk_smem_cols = round_up(spec.head_dim_qk, kPanelCols);
  t.v_smem_cols = round_up(spec.head_dim_v, kPanelCols);
  // O is staged for its TMA store either in the Q region (Q is dead once the tile's last QK is
  // done, but the next tile's Q then waits for the epilogue) or in its own region (Q is released
  // after the last QK and the next Q loads under the last PV and the epilogue).
  const bool separate_o_default = three_wgs || short_causal || (!t.masked && max_dim <= kMaxHeadDimSeparateO);
  t.separate_o = tuning.separate_o >= 0 ? tuning.separate_o != 0 : separate_o_default;
  t.q_bytes = t.block_m * t.qk_smem_cols * kElemBytes;
  t.o_bytes = t.block_m * t.v_smem_cols * kElemBytes;
  t.qo_bytes = t.separate_o ? round_up(t.q_bytes, kTmaSwizzleAlign) + t.o_bytes : std::max(t.q_bytes, t.o_bytes);
  const int kv_bytes_per_row = t.stages * (t.qk_smem_cols + t.v_smem_cols) * kElemBytes;
  t.smem_limit = max_shared_bytes_per_block(spec.arch);
  // The tile ring of drawn tiles is counted where a tuning asks for it; the default's ring fits in the
  // barrier region's slack of every tile the snake would take (Fa3Tuning.DrawnTilesKeepTheSnakesTile).
  const int n_by_smem =
      (t.smem_limit - kTmaSwizzleAlign - barrier_bytes(t.stages, tuning.dynamic_tiles > 0) - t.qo_bytes) /
      kv_bytes_per_row;
  // S: n/2, P: n/4 registers per thread.
  constexpr int kAccRegsNumer = 4, kAccRegsDenom = 3;
  const int reg_overhead = three_wgs ? kConsumerRegOverhead3 : kConsumerRegOverhead2;
  const int n_by_regs = (regs_consumer - reg_overhead - spec.head_dim_v / 2) * kAccRegsNumer / kAccRegsDenom;
  int block_n = std::min({n_by_smem, n_by_regs, small_dim ? kMaxBlockNSmallDim : kMaxBlockN});
  if (t.masked)
    block_n = std::min(block_n, kMaxBlockNMasked);
  const int whole_pages_n = round_down(block_n, kPagedWholeBlockKeys);
  block_n = round_down(block_n, kBlockNGranule);
  const bool tall_boxes_already =
      spec.page_size != 0 && std::gcd(block_n, spec.page_size) >= kPagedWholeBlockTallBoxRows;
  const bool keeps_most_keys = whole_pages_n * kPagedWholeBlockKeptDen >= block_n * kPagedWholeBlockKeptNum;
  if (whole_pages && whole_pages_n >= kPagedWholeBlockKeys && (!tall_boxes_already || keeps_most_keys))
    block_n = whole_pages_n;
  // A tuned block wins over the spec's short-key block (A/B runs tune specs of any key length).
  const int chosen_n = tuning.block_n > 0 ? tuning.block_n : spec.key_block;
  if (chosen_n > 0) {
    if (chosen_n % kBlockNGranule != 0 || chosen_n > std::min(n_by_smem, kMaxHeadDim))
      return refuse("fa3: kBlockN " + std::to_string(chosen_n) + " (tuned or the spec's key block) does not fit");
    block_n = chosen_n;
  }
  if (block_n < kBlockNGranule)
    return refuse("fa3: no kBlockN fits shared memory for d=" + std::to_string(spec.head_dim_qk));
  t.block_n = block_n;
  return true;
}

} // namespace

std::string fa2_preferred_for_pages(const KernelSpec &spec, const Fa3Tuning *tuning) {
  const Fa3Tuning untuned;
  const Fa3Tuning &t = tuning ? *tuning : untuned;
  const int max_dim = std::max(spec.head_dim_qk, spec.head_dim_v);
  if (spec.page_size == 0 || t.paged == 1 || t.paged_gather == 1 || !pages_gathered(spec, t) ||
      max_dim > kMaxHeadDimFa2ForGatheredPages)
    return "";
  return "page_size " + std::to_string(spec.page_size) + " is not a multiple of " + std::to_string(kMinPagedBoxRows) +
         " keys, so fa3 would gather its rows by cp.async, and at head dims up to " +
         std::to_string(kMaxHeadDimFa2ForGatheredPages) + " fa2's paged stream is faster (tuning paged=1 keeps fa3)";
}

bool plan_fa3_tuned(const KernelSpec &spec, const Fa3Tuning &tuning, Plan *plan, std::string *why_not,
                    flashjit_backend backend) {
  auto refuse = [&](const std::string &reason) {
    if (why_not)
      *why_not = reason;
    return false;
  };
  Fa3Tile tile;
  if (!fa3_tile(spec, tuning, backend, &tile, why_not))
    return false;
  const auto [stages, consumer_wgs, block_m, block_n, masked, separate_o, qk_smem_cols, v_smem_cols, q_bytes, o_bytes,
              qo_bytes, smem_limit] = tile;
  const bool three_wgs = consumer_wgs == kMaxConsumerWarpgroups;
  const int max_dim = std::max(spec.head_dim_qk, spec.head_dim_v);
  const bool small_dim = max_dim <= kSmallHeadDim;
  const int regs_producer = three_wgs ? kRegsProducer3 : kRegsProducer2;
  const int regs_consumer = three_wgs ? kRegsConsumer3 : kRegsConsumer2;
  const int q_panel_bytes = block_m * kSwizzleBytes;

  const bool pair_fits = fa3_pairs_can_run(spec, backend) &&
                         ((consumer_wgs == kConsumerWarpgroupsDefault && max_dim >= kMinHeadDimCluster) ||
                          (fa3_odd_eights(spec) && max_dim >= kMinHeadDimClusterOddEights));
  const int cluster_m = tuning.cluster_m > 0 ? tuning.cluster_m : pair_fits ? kClusterPair : 1;
  if (cluster_m != 1 && cluster_m != kClusterPair)
    return refuse("fa3: cluster_m must be 1 or 2");
  if (cluster_m == kClusterPair && (masked || lengths_vary(spec)))
    return refuse("fa3: CTA pairs need every m-block to see every key (no causal, window, varlen or paged KV)");
  // Each CTA of a pair loads half of a block's rows; the halves must start on a swizzle atom.
  constexpr int kSwizzleAtomRows = kTmaSwizzleAlign / kSwizzleBytes;
  if (block_n % (cluster_m * kSwizzleAtomRows) != 0)
    return refuse("fa3: kBlockN " + std::to_string(block_n) + " does not split into swizzle atoms per CTA");

  if (tuning.cross_tile_overlap > 0 && !separate_o)
    return refuse("fa3: cross_tile_overlap needs the separate O region (separate_o)");
  if (tuning.cross_tile_overlap > 0 && backend == FLASHJIT_BACKEND_MLIR)
    return refuse("fa3: cross_tile_overlap has a template form only (NVRTC)");
  if (tuning.cross_tile_overlap > 0 && spec.page_size != 0)
    return refuse("fa3: cross_tile_overlap is not built for paged KV");
  const bool cross_tile_overlap = tuning.cross_tile_overlap >= 0
                                      ? tuning.cross_tile_overlap != 0
                                      : kCrossTileOverlapDefault && separate_o && backend != FLASHJIT_BACKEND_MLIR;
  // Tail split (kTailSplit): the work of the last full wave and the partial one is divided evenly
  // by key blocks, so no walker idles while others finish a last tile; a tile cut between two
  // walkers is merged by the second to finish it (partial states in the caller's workspace).
  // Units must all cost the same (no causal, window or varlen). Template form only.
  if (tuning.tail_split > 0 && (masked || lengths_vary(spec)))
    return refuse("fa3: tail_split needs every tile to see every key (no causal, window, varlen or paged KV)");
  if (tuning.tail_split > 0 && backend == FLASHJIT_BACKEND_MLIR)
    return refuse("fa3: tail_split has a template form only (NVRTC)");
  if (tuning.tail_split > 0 && cross_tile_overlap)
    return refuse("fa3: tail_split walks one tile at a time (no cross_tile_overlap)");
  const bool tail_split = tuning.tail_split >= 0 ? tuning.tail_split != 0
                                                 : tail_split_by_default(spec, tile, backend) && !cross_tile_overlap;
  if (tuning.first_block_in_loop > 0 && backend == FLASHJIT_BACKEND_MLIR)
    return refuse("fa3: first_block_in_loop has a template form only (NVRTC)");
  if (tuning.first_block_in_loop > 0 && cross_tile_overlap)
    return refuse("fa3: first_block_in_loop walks one tile at a time (no cross_tile_overlap)");
  // Forms the MLIR generator does not render: asked for by name, they refuse an MLIR plan.
  const std::pair<const char *, int> template_only_forms[] = {{"q_desc_per_step", tuning.q_desc_per_step},
                                                              {"desc_advance", tuning.desc_advance},
                                                              {"programmatic_launch", tuning.programmatic_launch},
                                                              {"pingpong_softmax", tuning.pingpong_softmax},
                                                              {"exp_subtract_first", tuning.exp_subtract_first},
                                                              {"skip_masked_groups", tuning.skip_masked_groups},
                                                              {"early_qk_desc", tuning.early_qk_desc},
                                                              {"turn_over_qk", tuning.turn_over_qk},
                                                              {"s_before_pv", tuning.s_before_pv},
                                                              {"exp_before_max", tuning.exp_before_max},
                                                              {"timeline", tuning.timeline}};
  for (const auto &[form, value] : template_only_forms)
    if (value > 0 && backend == FLASHJIT_BACKEND_MLIR)
      return refuse(std::string("fa3: ") + form + " has a template form only (NVRTC)");
  if (tuning.unmasked_key_loop > 0 && masked)
    return refuse("fa3: unmasked_key_loop needs every key block below the last to be visible (no causal or window)");
  const bool q_desc_per_step =
      tuning.q_desc_per_step >= 0 ? tuning.q_desc_per_step != 0 : !three_wgs && backend != FLASHJIT_BACKEND_MLIR;
  // Q in registers (kQInRegisters): each consumer thread holds Q's A fragments for the tile and
  // every QK is an RS wgmma, so the tensor cores read only K from shared memory. Template form only;
  // not with the cross-tile stream (its next tile's first QK would need the next tile's fragments).
  // On by default for the short causal tile of contiguous K/V at small head dims
  // (kQInRegistersShortCausalSmallDim).
  if (tuning.q_in_registers > 0 && backend == FLASHJIT_BACKEND_MLIR)
    return refuse("fa3: q_in_registers has a template form only (NVRTC)");
  if (tuning.q_in_registers > 0 && cross_tile_overlap)
    return refuse("fa3: q_in_registers loads Q per tile (no cross_tile_overlap)");
  const bool short_causal_small_dim =
      spec.causal && !spec.local && spec.page_size == 0 && spec.key_block == kShortKeyBlock && small_dim;
  const bool q_in_registers = tuning.q_in_registers >= 0 ? tuning.q_in_registers != 0
                                                         : kQInRegistersShortCausalSmallDim && short_causal_small_dim &&
                                                               !cross_tile_overlap && backend != FLASHJIT_BACKEND_MLIR;
  // Dynamic tiles (kDynamicTiles): one producing thread draws the tiles and hands them to the
  // consumers, so single CTAs with TMA K/V walking whole tiles one at a time. Template form only.
  const bool snake_short_causal =
      spec.key_block == kShortKeyBlock && !small_dim && max_dim <= kMaxHeadDimSnakeShortCausal;
  const bool dynamic_by_default = spec.causal && !spec.local && spec.page_size == 0 && !snake_short_causal &&
                                  cluster_m == 1 && !tail_split && !cross_tile_overlap &&
                                  backend != FLASHJIT_BACKEND_MLIR;
  const bool dynamic_tiles = tuning.dynamic_tiles >= 0 ? tuning.dynamic_tiles != 0 : dynamic_by_default;
  if (dynamic_tiles && backend == FLASHJIT_BACKEND_MLIR)
    return refuse("fa3: dynamic_tiles has a template form only (NVRTC)");
  if (dynamic_tiles && (cluster_m != 1 || tail_split || cross_tile_overlap))
    return refuse("fa3: dynamic_tiles hands out whole tiles to single CTAs (no cluster_m 2, tail_split or "
                  "cross_tile_overlap)");
  if (dynamic_tiles && spec.page_size != 0)
    return refuse("fa3: dynamic_tiles is built for contiguous K/V (its producer is one thread)");
  if (tuning.causal_sections > kCausalSectionsMax)
    return refuse("fa3: causal_sections must be 0, 1, 2 or 3");
  if (tuning.causal_section_pairs < 0)
    return refuse("fa3: causal_section_pairs must be 0 (by causal_sections) or a number of pairs");
  if (tuning.section_pairs < 0 || (tuning.section_pairs > 0 && masked))
    return refuse("fa3: section_pairs must be 0 or a number of pairs, and walks of unmasked tiles only "
                  "(causal_section_pairs for causal ones)");
  if (tuning.l2_promotion >= 0 && tuning.l2_promotion != 0 && tuning.l2_promotion != 64 && tuning.l2_promotion != 128 &&
      tuning.l2_promotion != 256)
    return refuse("fa3: l2_promotion must be 0, 64, 128 or 256 bytes");
  const int column_groups = block_n / kColsPerGroup;
  if (tuning.skip_masked_groups == kSkipMaskedHalf && column_groups % (2 * kGroupsPerSkipChunk) != 0)
    return refuse("fa3: skip_masked_groups=2 halves key blocks of a multiple of " +
                  std::to_string(2 * kGroupsPerSkipChunk * kColsPerGroup) + " keys, got " + std::to_string(block_n));
  int row_max_partials = three_wgs ? kRowMaxPartialsThreeWarpgroups : kRowMaxPartialsTwoWarpgroups;
  while (row_max_partials > column_groups)
    row_max_partials /= 2; // small key blocks: as many as there are column groups (a power of two)
  if (tuning.row_max_partials > 0)
    row_max_partials = tuning.row_max_partials;
  if ((row_max_partials & (row_max_partials - 1)) != 0 || row_max_partials > column_groups)
    return refuse("fa3: row_max_partials must be a power of two up to kBlockN / 8 (" + std::to_string(column_groups) +
                  "), got " + std::to_string(row_max_partials));
  if (tuning.ptxas_opt_level < 0 || tuning.ptxas_opt_level > kPtxasOptLevelDefault)
    return refuse("fa3: ptxas_opt_level must be 0 (ptxas's default), 1, 2 or 3, got " +
                  std::to_string(tuning.ptxas_opt_level));
  const bool ptxas_level_lowered = tuning.ptxas_opt_level > 0 && tuning.ptxas_opt_level < kPtxasOptLevelDefault;
  if (ptxas_level_lowered && backend == FLASHJIT_BACKEND_MLIR)
    return refuse("fa3: ptxas_opt_level is an NVRTC option only");
  const int row_sum_partials = tuning.row_sum_partials > 0 ? tuning.row_sum_partials : kRowSumPartialsDefault;
  if (tuning.row_sum_partials < 0 || (row_sum_partials & (row_sum_partials - 1)) != 0 ||
      row_sum_partials > column_groups)
    return refuse("fa3: row_sum_partials must be a power of two up to kBlockN / 8 (" + std::to_string(column_groups) +
                  "), got " + std::to_string(tuning.row_sum_partials));
  if (row_sum_partials > 1 && backend == FLASHJIT_BACKEND_MLIR)
    return refuse("fa3: row_sum_partials has a template form only (NVRTC)");

  const int k_stage_bytes = block_n * qk_smem_cols * kElemBytes;
  const int v_stage_bytes = block_n * v_smem_cols * kElemBytes;
  const int offset_q = 0;
  const int offset_o = separate_o ? offset_q + round_up(q_bytes, kTmaSwizzleAlign) : offset_q;
  const int offset_k = offset_q + round_up(qo_bytes, kTmaSwizzleAlign);
  const int offset_v = offset_k + stages * k_stage_bytes;
  const int offset_barriers = offset_v + stages * v_stage_bytes;
  // The dynamic smem base is only 16-byte aligned: the kernel rounds it up to 1024.
  const int smem_bytes = offset_barriers + barrier_bytes(stages, dynamic_tiles) + kTmaSwizzleAlign;
  if (smem_bytes > smem_limit)
    return refuse("fa3: shared memory plan exceeds the device limit");

  *plan = Plan{}; // constants are appended: start from none
  plan->variant = Variant::fa3;
  plan->entry = "fj_fa3_prefill";
  plan->block_m = block_m;
  plan->block_n = block_n;
  plan->stages = stages;
  plan->threads = kWarpgroupThreads * (1 + consumer_wgs);
  plan->smem_bytes = smem_bytes;
  plan->consumer_warpgroups = consumer_wgs;
  // Pingpong: the other warpgroup's softmax hides under this one's GEMMs (-15% without it at
  // d64..d128). Measured on H200: off is better for non-causal d192/d256 (+1.4% / +1.9%), on is
  // better for causal d256 (+3%), where the masked diagonal blocks make the GEMMs uneven.
  plan->pingpong =
      tuning.pingpong >= 0 ? tuning.pingpong != 0 : (spec.head_dim_qk <= kMaxPingpongHeadDim || spec.causal);
  plan->persistent = true;
  plan->cluster_m = cluster_m;

  // kThreads and kSmemBytes are emitted by the generator from plan->threads / smem_bytes.
  plan->add("kBlockM", block_m);
  plan->add("kBlockN", block_n);
  plan->add("kStages", stages);
  plan->add("kConsumerWarpgroups", consumer_wgs);
  plan->add_bool("kPingpong", plan->pingpong);
  plan->add("kRegsProducer", regs_producer);
  plan->add("kRegsConsumer", regs_consumer);
  plan->add("kClusterM", cluster_m);
  plan->add("kKVRowsPerCta", block_n / cluster_m); // rows of a K/V block this CTA loads (and multicasts)
  plan->add("kKStepsQK", round_up(spec.head_dim_qk, kKStep) / kKStep);
  plan->add("kKStepsPV", block_n / kKStep);
  plan->add("kPanelCols", kPanelCols);
  plan->add("kPanelsQK", qk_smem_cols / kPanelCols);
  plan->add("kPanelsV", v_smem_cols / kPanelCols);
  plan->add("kSwizzleBytes", kSwizzleBytes);
  plan->add("kWgmmaSwizzle", kWgmmaSwizzle128);
  plan->add("kTmaBoxRows", kRowsPerTmaBox);
  const bool paged_gather = pages_gathered(spec, tuning);
  plan->add_bool("kPagedGather", paged_gather);
  plan->add_bool("kGatherNoincArrive",
                 paged_gather && (tuning.gather_noinc >= 0 ? tuning.gather_noinc != 0 : kGatherNoincDefault));
  plan->add("kPagedBoxRows", spec.page_size != 0 && !paged_gather ? std::gcd(spec.page_size, block_n) : 0);
  plan->add("kSmemAlign", kTmaSwizzleAlign);
  plan->add("kSmemOffsetQ", offset_q);
  plan->add("kSmemPanelBytesQ", q_panel_bytes);
  plan->add_bool("kSeparateO", separate_o);
  plan->add("kSmemOffsetO", offset_o);
  plan->add("kSmemOffsetK", offset_k);
  plan->add("kSmemStageBytesK", k_stage_bytes);
  plan->add("kSmemOffsetV", offset_v);
  plan->add("kSmemStageBytesV", v_stage_bytes);
  plan->add("kSmemPanelBytesKV", block_n * kSwizzleBytes);
  plan->add("kSmemOffsetBarriers", offset_barriers);
  plan->add("kTxBytesQ", q_bytes);
  plan->add("kTxBytesK", k_stage_bytes);
  plan->add("kTxBytesV", v_stage_bytes);
  plan->add("kBarrierPingpong", kBarrierPingpong);
  plan->add("kBarrierEpilogue", kBarrierPingpong + consumer_wgs);
  // Rescaling O between the QK and PV issues (FA-3's RescaleOBeforeGemm) measured -1.5% at d128,
  // -0.5% at d80, within noise with 3 warpgroups: off unless tuned.
  plan->add_bool("kRescaleBeforePv", tuning.rescale_before_pv > 0);
  // The MLIR generator renders eager rescaling only (like CTA pairs, NVRTC plans only).
  const bool lazy_default =
      backend != FLASHJIT_BACKEND_MLIR && (!lengths_vary(spec) || kLazyTopRoundingVaryingLengths) &&
      (!plan->pingpong ||
       (three_wgs && max_dim >= kMinHeadDimLazyRescale3Wg && (max_dim <= kMaxHeadDimLazyRescale3Wg || spec.causal)) ||
       (spec.causal && max_dim >= kMinHeadDimLazyRescalePingpongCausal));
  const bool lazy = tuning.lazy_rescale >= 0 ? tuning.lazy_rescale != 0 : lazy_default;
  plan->add_bool("kLazyRescale", lazy);
  if (tuning.lazy_top_rounding > 0 && !lazy)
    return refuse("fa3: lazy_top_rounding corrects lazy rescaling; this plan rescales eagerly");
  const bool lazy_top_rounding = lazy && (tuning.lazy_top_rounding >= 0 ? tuning.lazy_top_rounding != 0
                                          : lengths_vary(spec)          ? kLazyTopRoundingVaryingLengths
                                                                        : kLazyTopRoundingFixedLengths);
  plan->add_bool("kLazyTopRounding", lazy_top_rounding);
  const int exp2_poly_every =
      tuning.exp2_poly_every >= 0 ? tuning.exp2_poly_every : (small_dim ? kExp2PolyEverySmallDim : 0);
  // The top rounding takes the block's top p from MUFU's exp2; where the top element's own p comes
  // from the polynomial, the two may round to different 16-bit values (review, session 28).
  if (lazy_top_rounding && exp2_poly_every > 0)
    return refuse("fa3: lazy_top_rounding needs every exponential on MUFU (exp2_poly_every 0)");
  plan->add("kExp2PolyEvery", exp2_poly_every);
  plan->add("kRowMaxPartials", row_max_partials);
  plan->add("kRowSumPartials", row_sum_partials);
  // Only a lowered level is a constant: the default kernels' sources (and cache keys) stay as they were.
  if (ptxas_level_lowered)
    plan->add("kPtxasOptLevel", tuning.ptxas_opt_level);
  plan->add_bool("kCrossTileOverlap", cross_tile_overlap);
  plan->add_bool("kTailSplit", tail_split);
  plan->add_bool("kDynamicTiles", dynamic_tiles);
  plan->add("kTileSlots", dynamic_tiles ? kTileSlots : 0);
  const bool first_block_in_loop = tuning.first_block_in_loop >= 0
                                       ? tuning.first_block_in_loop != 0
                                       : kFirstBlockInLoopWithoutPingpong && !plan->pingpong && !cross_tile_overlap &&
                                             backend != FLASHJIT_BACKEND_MLIR;
  plan->add_bool("kFirstBlockInLoop", first_block_in_loop);
  if (tuning.unmasked_key_loop > 0 && (first_block_in_loop || cross_tile_overlap))
    return refuse("fa3: unmasked_key_loop needs the prologue form (no first_block_in_loop or cross_tile_overlap)");
  plan->add_bool("kUnmaskedKeyLoop", tuning.unmasked_key_loop >= 0 ? tuning.unmasked_key_loop != 0
                                                                   : kUnmaskedKeyLoopDefault && !masked &&
                                                                         !first_block_in_loop && !cross_tile_overlap);
  plan->add_bool("kProgrammaticLaunch", tuning.programmatic_launch >= 0
                                            ? tuning.programmatic_launch != 0
                                            : kProgrammaticLaunchDefault && backend != FLASHJIT_BACKEND_MLIR);
  plan->add_bool("kQDescPerStep", q_desc_per_step);
  plan->add_bool("kQInRegisters", q_in_registers);
  plan->add_bool("kDescAdvance", tuning.desc_advance >= 0 ? tuning.desc_advance != 0
                                                          : kDescAdvanceDefault && !short_causal_tile(spec) &&
                                                                backend != FLASHJIT_BACKEND_MLIR);
  if (tuning.pingpong_softmax > 0 && !plan->pingpong)
    return refuse("fa3: pingpong_softmax needs pingpong");
  plan->add_bool("kPingpongSoftmax", tuning.pingpong_softmax >= 0 ? tuning.pingpong_softmax != 0
                                                                  : kPingpongSoftmaxDefault && plan->pingpong &&
                                                                        backend != FLASHJIT_BACKEND_MLIR);
  // A diagnostic, never chosen by the planner: the kernel's code between the points is the default's.
  plan->add_bool("kTimeline", tuning.timeline > 0);
  plan->add_bool("kEarlyQkDesc", tuning.early_qk_desc >= 0 ? tuning.early_qk_desc != 0
                                                           : kEarlyQkDescDefault && backend != FLASHJIT_BACKEND_MLIR);
  if (tuning.turn_over_qk > 0 && (!plan->pingpong || tuning.pingpong_softmax > 0))
    return refuse("fa3: turn_over_qk needs pingpong turns over the GEMMs (no pingpong_softmax)");
  plan->add_bool("kTurnOverQk", tuning.turn_over_qk >= 0
                                    ? tuning.turn_over_qk != 0
                                    : kTurnOverQkDefault && plan->pingpong && backend != FLASHJIT_BACKEND_MLIR);
  plan->add_bool("kSBeforePv", tuning.s_before_pv >= 0 ? tuning.s_before_pv != 0
                                                       : kSBeforePvDefault && backend != FLASHJIT_BACKEND_MLIR);
  const bool exp_before_max = tuning.exp_before_max >= 0 ? tuning.exp_before_max != 0
                                                         : kExpBeforeMaxDefault && backend != FLASHJIT_BACKEND_MLIR;
  if (exp_before_max && (lazy || exp2_poly_every > 0 || first_block_in_loop || cross_tile_overlap ||
                         plan->constant("kPingpongSoftmax") != 0))
    return refuse("fa3: exp_before_max needs eager rescaling on MUFU (no lazy_rescale or exp2_poly_every), the "
                  "prologue's own first block (no first_block_in_loop or cross_tile_overlap) and no pingpong_softmax");
  plan->add_bool("kExpBeforeMax", exp_before_max);
  if (exp_before_max) {
    plan->add("kExpJumpLog2", spec.dtype == FLASHJIT_FP16 ? kExpJumpLog2Fp16 : kExpJumpLog2Bf16);
    plan->add("kBarrierVote", kBarrierPingpong + 2 * consumer_wgs + 1); // one per consumer warpgroup, after the tail's
  }
  plan->add_bool("kExpSubtractFirst", tuning.exp_subtract_first >= 0
                                          ? tuning.exp_subtract_first != 0
                                          : kExpSubtractFirstDefault && backend != FLASHJIT_BACKEND_MLIR);
  plan->add("kSkipMaskedGroups", tuning.skip_masked_groups >= 0     ? tuning.skip_masked_groups
                                 : backend != FLASHJIT_BACKEND_MLIR ? kSkipMaskedGroupsDefault
                                                                    : kSkipMaskedNone);
  plan->add("kSkipChunkGroups", kGroupsPerSkipChunk);
  plan->add("kTmaL2PromotionBytes", tuning.l2_promotion >= 0 ? tuning.l2_promotion : kTmaL2PromotionBytes);
  if (spec.causal) {
    plan->add("kCausalSections", tuning.causal_sections >= 0 ? tuning.causal_sections : kCausalSectionsByPairs);
    if (tuning.causal_section_pairs > 0)
      plan->add("kCausalSectionPairs", tuning.causal_section_pairs);
    if (dynamic_tiles) {
      plan->add("kDrawnSectionPairs", small_dim ? kDrawnSectionPairsSmallDim : kDrawnSectionPairs);
      if (max_dim > kMaxHeadDimMidDrawnSections) {
        plan->add("kDrawnSectionPairsShortWalk", kDrawnSectionPairsShortWalk);
        plan->add("kMaxMBlocksShortDrawnWalk", kMaxMBlocksShortDrawnWalk);
      }
    }
  }
  if (tuning.section_pairs > 0)
    plan->add("kSectionPairs", tuning.section_pairs);
  plan->add("kBarrierTail", kBarrierPingpong + 2 * consumer_wgs); // all consumer warpgroups
  plan->add("kTailPieces", kTailPieces);
  // One piece's partial state per consumer thread: its O accumulators, its rows' max and sum share
  // (and their top-rounding shares, padded to a float4).
  plan->add("kTailSlotFloats", consumer_wgs * kWarpgroupThreads *
                                   (spec.head_dim_v / 2 + 2 * kRowsPerThread + (lazy_top_rounding ? kFloatVec : 0)));
  return true;
}

bool plan_fa3(const KernelSpec &spec, Plan *plan, std::string *why_not, flashjit_backend backend) {
  return plan_fa3_tuned(spec, Fa3Tuning{}, plan, why_not, backend);
}

bool parse_fa3_tuning(const std::string &text, Fa3Tuning *out, std::string *error) {
  Fa3Tuning tuning;
  const std::pair<const char *, int Fa3Tuning::*> fields[] = {
      {"block_n", &Fa3Tuning::block_n},
      {"pingpong", &Fa3Tuning::pingpong},
      {"exp2_poly_every", &Fa3Tuning::exp2_poly_every},
      {"consumer_warpgroups", &Fa3Tuning::consumer_warpgroups},
      {"separate_o", &Fa3Tuning::separate_o},
      {"rescale_before_pv", &Fa3Tuning::rescale_before_pv},
      {"cluster_m", &Fa3Tuning::cluster_m},
      {"lazy_rescale", &Fa3Tuning::lazy_rescale},
      {"lazy_top_rounding", &Fa3Tuning::lazy_top_rounding},
      {"row_max_partials", &Fa3Tuning::row_max_partials},
      {"row_sum_partials", &Fa3Tuning::row_sum_partials},
      {"cross_tile_overlap", &Fa3Tuning::cross_tile_overlap},
      {"tail_split", &Fa3Tuning::tail_split},
      {"first_block_in_loop", &Fa3Tuning::first_block_in_loop},
      {"q_desc_per_step", &Fa3Tuning::q_desc_per_step},
      {"q_in_registers", &Fa3Tuning::q_in_registers},
      {"desc_advance", &Fa3Tuning::desc_advance},
      {"pingpong_softmax", &Fa3Tuning::pingpong_softmax},
      {"early_qk_desc", &Fa3Tuning::early_qk_desc},
      {"turn_over_qk", &Fa3Tuning::turn_over_qk},
      {"s_before_pv", &Fa3Tuning::s_before_pv},
      {"exp_before_max", &Fa3Tuning::exp_before_max},
      {"timeline", &Fa3Tuning::timeline},
      {"exp_subtract_first", &Fa3Tuning::exp_subtract_first},
      {"skip_masked_groups", &Fa3Tuning::skip_masked_groups},
      {"l2_promotion", &Fa3Tuning::l2_promotion},
      {"programmatic_launch", &Fa3Tuning::programmatic_launch},
      {"unmasked_key_loop", &Fa3Tuning::unmasked_key_loop},
      {"causal_sections", &Fa3Tuning::causal_sections},
      {"causal_section_pairs", &Fa3Tuning::causal_section_pairs},
      {"section_pairs", &Fa3Tuning::section_pairs},
      {"ptxas_opt_level", &Fa3Tuning::ptxas_opt_level},
      {"paged", &Fa3Tuning::paged},
      {"paged_gather", &Fa3Tuning::paged_gather},
      {"stages", &Fa3Tuning::stages},
      {"gather_noinc", &Fa3Tuning::gather_noinc},
      {"dynamic_tiles", &Fa3Tuning::dynamic_tiles},
  };
  size_t begin = 0;
  while (begin <= text.size()) {
    const size_t end = std::min(text.find(',', begin), text.size());
    const std::string item = text.substr(begin, end - begin);
    begin = end + 1;
    if (item.empty())
      continue;
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq);
    const auto field =
        std::find_if(std::begin(fields), std::end(fields), [&](const auto &f) { return key == f.first; });
    if (field == std::end(fields)) {
      std::string keys;
      for (const auto &[name, member] : fields)
        keys += (keys.empty() ? "" : ", ") + std::string(name);
      *error = "'" + item + "': unknown key (" + keys + ")";
      return false;
    }
    const std::string value = eq == std::string::npos ? "" : item.substr(eq + 1);
    int parsed = 0;
    const auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), parsed);
    if (value.empty() || ec != std::errc() || ptr != value.data() + value.size()) {
      *error = "'" + item + "': expected " + key + "=<integer>";
      return false;
    }
    tuning.*(field->second) = parsed;
  }
  *out = tuning;
  return true;
}

namespace {

// A fixed-length spec's alternative key block for short sequences (0: none), with its default tile.
// The cheap refusals come first: this runs on every prefill call.
//  - causal, three warpgroups by default (NVRTC): the short causal tile (kShortKeyBlock, two warpgroups);
//  - unmasked, a default block longer than kShortKeyBlock: that block, where it pads the keys less;
//  - causal, two warpgroups of kNarrowedKeyBlockFrom keys (NVRTC): kNarrowKeyBlock, for short sequences
//    (d192 S1024 causal +1.5..3.0%, runs 29f-g);
//  - unmasked, two warpgroups of kNarrowedKeyBlockFrom keys (NVRTC): kNarrowKeyBlock, likewise;
//  - unmasked with the tail split: the default block without the split, where no unit has enough key
//    blocks to split (kFa3TailMinSavedBlocks). The split's code alone cost 2.8-3.1% at d64 S1024 and
//    0.4-0.9% at d80/d96 S1024 (run 29b, bf16 / fp16), where fa3_fill_tail never splits.
int short_alternative(const KernelSpec &spec, flashjit_backend backend, Fa3Tile *tile) {
  // Varlen sequences each pad differently; a window is no causal triangle.
  if (spec.op != Op::prefill || spec.arch.sm != 90 || !spec.arch.arch_specific || spec.page_size != 0 ||
      spec.align_bytes % 16 != 0 || spec.local || spec.varlen)
    return 0;
  KernelSpec default_spec = spec;
  default_spec.key_block = 0;
  // The default tile is a pure function of (spec, backend), and a thread's calls mostly repeat one
  // spec: the last answer is kept (planning it took 35 of a hot call's 200 ns of validation and
  // spec on session 38's machine).
  struct LastTile {
    bool valid = false;
    KernelSpec spec;
    flashjit_backend backend = FLASHJIT_BACKEND_NVRTC;
    bool ok = false;
    Fa3Tile tile;
  };
  thread_local LastTile last;
  if (!last.valid || !(last.spec == default_spec) || last.backend != backend) {
    last.ok = fa3_tile(default_spec, Fa3Tuning{}, backend, &last.tile, nullptr);
    last.spec = default_spec;
    last.backend = backend;
    last.valid = true;
  }
  if (!last.ok)
    return 0;
  *tile = last.tile;
  // The MLIR plans keep their tiles: the short causal tile and the narrow block were measured with the
  // templates alone.
  const bool narrows = tile->block_n == kNarrowedKeyBlockFrom && tile->consumer_wgs == kConsumerWarpgroupsDefault &&
                       backend != FLASHJIT_BACKEND_MLIR;
  if (spec.causal)
    return tile->consumer_wgs == kMaxConsumerWarpgroups && backend != FLASHJIT_BACKEND_MLIR ? kShortKeyBlock
           : narrows                                                                        ? kNarrowKeyBlock
                                                                                            : 0;
  if (tile->block_n > kShortKeyBlock)
    return kShortKeyBlock;
  if (narrows)
    return kNarrowKeyBlock;
  return tail_split_by_default(default_spec, *tile, backend) ? tile->block_n : 0;
}

} // namespace

int fa3_short_key_block(const KernelSpec &spec, flashjit_backend backend) {
  Fa3Tile tile;
  return short_alternative(spec, backend, &tile);
}

int fa3_key_block_for(const KernelSpec &spec, int seqlen_q, int seqlen_k, flashjit_backend backend) {
  // The lengths first: every prefill call asks, and most causal ones are past the short tile's.
  if (seqlen_k <= 0 || (spec.causal && std::max(seqlen_q, seqlen_k) > kMaxSeqlenShortCausal))
    return 0;
  Fa3Tile tile;
  const int alternative = short_alternative(spec, backend, &tile);
  if (alternative == 0 || spec.causal)
    return alternative;
  if (alternative == tile.block_n) // the same block without the tail split
    return seqlen_k <= kFa3TailMinSavedBlocks * tile.block_n ? alternative : 0;
  // Keys each block computes, padded to whole blocks, at the measured cost per key of each block.
  auto padded_keys = [seqlen_k](int block_n) { return (seqlen_k + block_n - 1) / block_n * block_n; };
  const int64_t default_cost = int64_t(padded_keys(tile.block_n)) * kShortKeyBlockCostDenom;
  const int cost_numer = alternative == kNarrowKeyBlock ? kNarrowKeyBlockCostNumer : kShortKeyBlockCostNumer;
  const int64_t short_cost = int64_t(padded_keys(alternative)) * cost_numer;
  return short_cost < default_cost ? alternative : 0;
}

} // namespace flashjit
