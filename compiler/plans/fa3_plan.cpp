// Plan for the FlashAttention-3 kernel (templates/kernels/fa3_prefill.cuh) on sm_90a.
//
// CTA = 1 producer warpgroup (one thread issues every TMA) + 2 consumer warpgroups of 64 query
// rows each (kBlockM = 128). K and V each get a 2-stage ring. Every operand tile is stored as
// 64-column panels of 128-byte rows with the 128B swizzle (what TMA writes and wgmma reads); head
// dims that are not a multiple of 64 round their *smem* width up to the next panel, while the
// QK reduction issues only ceil(d/16) k-steps and PV uses N = head_dim_v exactly.
// kBlockN is the largest multiple of 16 that fits both shared memory and the consumer register
// budget (S + P + O accumulators), capped at 128 for causal/local (finer diagonal granularity).
#include "compiler/planner.hpp"
#include "compiler/plans/fa3_plan.hpp"

#include <algorithm>
#include <string>

namespace flashjit {
namespace {

constexpr int kBlockM = 128;            // 2 consumer warpgroups x 64 rows (wgmma M)
constexpr int kConsumerWarpgroups = 2;
constexpr int kWarpgroupThreads = 128;
constexpr int kStages = 2;              // FA-3 uses 2 on sm_90 for every head dim
constexpr int kElemBytes = 2;           // fp16 / bf16
constexpr int kSwizzleBytes = 128;      // one smem row of a panel; TMA + wgmma 128B swizzle
constexpr int kPanelCols = kSwizzleBytes / kElemBytes;
constexpr int kWgmmaSwizzle128 = 1;     // wgmma descriptor layout code of the 128B swizzle
constexpr int kTmaSwizzleAlign = 1024;  // 8 rows x 128 B: a swizzle atom; tiles start on it
constexpr int kBarrierBytes = 128;      // mbarriers (8 B each) at the end of smem
constexpr int kKStep = 16;              // wgmma K for 16-bit inputs
constexpr int kBlockNGranule = 16;      // PV reduces over kBlockN in k-steps of 16
constexpr int kMaxBlockN = 192;
constexpr int kMaxBlockNSmallDim = 224; // dv <= 64: fewer, longer iterations measured +3% at d64
constexpr int kSmallHeadDim = 64;
constexpr int kMaxBlockNMasked = 128;   // causal / local
constexpr int kMinHeadDim = 8;
constexpr int kMaxHeadDim = 256;        // one wgmma N
constexpr int kHeadDimGranule = 8;
constexpr int kRowsPerTmaBox = 64;
constexpr int kMaxPingpongHeadDim = 128;
// Exponentials on the FMA pipe (every k-th 8-column group; 0 = all on MUFU). Measured on H200:
// +2.4% at d64 with N=192 (k = 4) but none on top of N=224 (441 vs 445 TFLOP/s), -3..-4% at
// d96/d128, so it is off by default and left as a tuning knob.
constexpr int kExp2PolyEverySmallDim = 0;      // Q / O boxes cover one consumer warpgroup's rows
// Register split (setmaxnreg): 128 * (24 + 2 * 240) = 64,512 <= 64K registers per SM.
constexpr int kRegsProducer = 24;
constexpr int kRegsConsumer = 240;
// Registers per consumer thread left for S (kBlockN/2 f32), P (kBlockN/4 b32) and O (dv/2 f32)
// once addresses, row statistics and loop state are counted.
constexpr int kAccumulatorRegBudget = 200;
// Named barriers: 0 is __syncthreads; then one pingpong barrier and one epilogue barrier per
// consumer warpgroup.
constexpr int kBarrierPingpong = 1;
constexpr int kBarrierEpilogue = kBarrierPingpong + kConsumerWarpgroups;

int round_up(int value, int multiple) { return (value + multiple - 1) / multiple * multiple; }
int round_down(int value, int multiple) { return value / multiple * multiple; }

} // namespace

bool plan_fa3_tuned(const KernelSpec &spec, const Fa3Tuning &tuning, Plan *plan, std::string *why_not) {
  auto refuse = [&](const std::string &reason) {
    if (why_not)
      *why_not = reason;
    return false;
  };
  if (spec.op != Op::prefill)
    return refuse("fa3 implements prefill only");
  if (spec.arch.sm != 90 || !spec.arch.arch_specific)
    return refuse("fa3 needs sm_90a (wgmma, setmaxnreg)");
  if (spec.page_size != 0)
    return refuse("fa3 does not implement paged KV");
  if (spec.align_bytes % 16 != 0)
    return refuse("fa3 needs 16-byte aligned rows (TMA strides)");
  for (int dim : {spec.head_dim_qk, spec.head_dim_v})
    if (dim < kMinHeadDim || dim > kMaxHeadDim || dim % kHeadDimGranule != 0)
      return refuse("fa3 head dims must be multiples of 8 in [8, 256], got " + std::to_string(dim));

  const int qk_smem_cols = round_up(spec.head_dim_qk, kPanelCols);
  const int v_smem_cols = round_up(spec.head_dim_v, kPanelCols);
  const int q_panel_bytes = kBlockM * kSwizzleBytes;
  // O is staged for its TMA store in the Q region (Q is dead once the tile's last QK is done).
  const int qo_bytes = kBlockM * std::max(qk_smem_cols, v_smem_cols) * kElemBytes;
  const int kv_bytes_per_row = kStages * (qk_smem_cols + v_smem_cols) * kElemBytes;
  const int smem_limit = max_shared_bytes_per_block(spec.arch);
  const int n_by_smem = (smem_limit - kTmaSwizzleAlign - kBarrierBytes - qo_bytes) / kv_bytes_per_row;
  // S: n/2, P: n/4 registers per thread.
  constexpr int kAccRegsNumer = 4, kAccRegsDenom = 3;
  const int n_by_regs = (kAccumulatorRegBudget - spec.head_dim_v / 2) * kAccRegsNumer / kAccRegsDenom;
  const bool small_dim = spec.head_dim_qk <= kSmallHeadDim && spec.head_dim_v <= kSmallHeadDim;
  int block_n = std::min({n_by_smem, n_by_regs, small_dim ? kMaxBlockNSmallDim : kMaxBlockN});
  if (spec.causal || spec.local)
    block_n = std::min(block_n, kMaxBlockNMasked);
  block_n = round_down(block_n, kBlockNGranule);
  if (tuning.block_n > 0) {
    if (tuning.block_n % kBlockNGranule != 0 || tuning.block_n > std::min(n_by_smem, kMaxHeadDim))
      return refuse("fa3: tuned kBlockN " + std::to_string(tuning.block_n) + " does not fit");
    block_n = tuning.block_n;
  }
  if (block_n < kBlockNGranule)
    return refuse("fa3: no kBlockN fits shared memory for d=" + std::to_string(spec.head_dim_qk));

  const int k_stage_bytes = block_n * qk_smem_cols * kElemBytes;
  const int v_stage_bytes = block_n * v_smem_cols * kElemBytes;
  const int offset_q = 0;
  const int offset_k = offset_q + round_up(qo_bytes, kTmaSwizzleAlign);
  const int offset_v = offset_k + kStages * k_stage_bytes;
  const int offset_barriers = offset_v + kStages * v_stage_bytes;
  // The dynamic smem base is only 16-byte aligned: the kernel rounds it up to 1024.
  const int smem_bytes = offset_barriers + kBarrierBytes + kTmaSwizzleAlign;
  if (smem_bytes > smem_limit)
    return refuse("fa3: shared memory plan exceeds the device limit");

  plan->variant = Variant::fa3;
  plan->entry = "fj_fa3_prefill";
  plan->block_m = kBlockM;
  plan->block_n = block_n;
  plan->stages = kStages;
  plan->threads = kWarpgroupThreads * (1 + kConsumerWarpgroups);
  plan->smem_bytes = smem_bytes;
  plan->consumer_warpgroups = kConsumerWarpgroups;
  // Pingpong: the other warpgroup's softmax hides under this one's GEMMs (-15% without it at
  // d64..d128). Measured on H200: off is better for non-causal d192/d256 (+1.4% / +1.9%), on is
  // better for causal d256 (+3%), where the masked diagonal blocks make the GEMMs uneven.
  plan->pingpong = tuning.pingpong >= 0 ? tuning.pingpong != 0
                                        : (spec.head_dim_qk <= kMaxPingpongHeadDim || spec.causal);
  plan->persistent = true;

  // kThreads and kSmemBytes are emitted by the generator from plan->threads / smem_bytes.
  plan->add("kBlockM", kBlockM);
  plan->add("kBlockN", block_n);
  plan->add("kStages", kStages);
  plan->add("kConsumerWarpgroups", kConsumerWarpgroups);
  plan->add_bool("kPingpong", plan->pingpong);
  plan->add("kRegsProducer", kRegsProducer);
  plan->add("kRegsConsumer", kRegsConsumer);
  plan->add("kKStepsQK", round_up(spec.head_dim_qk, kKStep) / kKStep);
  plan->add("kKStepsPV", block_n / kKStep);
  plan->add("kPanelCols", kPanelCols);
  plan->add("kPanelsQK", qk_smem_cols / kPanelCols);
  plan->add("kPanelsV", v_smem_cols / kPanelCols);
  plan->add("kSwizzleBytes", kSwizzleBytes);
  plan->add("kWgmmaSwizzle", kWgmmaSwizzle128);
  plan->add("kTmaBoxRows", kRowsPerTmaBox);
  plan->add("kSmemAlign", kTmaSwizzleAlign);
  plan->add("kSmemOffsetQ", offset_q);
  plan->add("kSmemPanelBytesQ", q_panel_bytes);
  plan->add("kSmemOffsetK", offset_k);
  plan->add("kSmemStageBytesK", k_stage_bytes);
  plan->add("kSmemOffsetV", offset_v);
  plan->add("kSmemStageBytesV", v_stage_bytes);
  plan->add("kSmemPanelBytesKV", block_n * kSwizzleBytes);
  plan->add("kSmemOffsetBarriers", offset_barriers);
  plan->add("kTxBytesQ", kBlockM * qk_smem_cols * kElemBytes);
  plan->add("kTxBytesK", k_stage_bytes);
  plan->add("kTxBytesV", v_stage_bytes);
  plan->add("kBarrierPingpong", kBarrierPingpong);
  plan->add("kBarrierEpilogue", kBarrierEpilogue);
  plan->add("kExp2PolyEvery", tuning.exp2_poly_every >= 0 ? tuning.exp2_poly_every
                                                          : (small_dim ? kExp2PolyEverySmallDim : 0));
  return true;
}

bool plan_fa3(const KernelSpec &spec, Plan *plan, std::string *why_not) {
  return plan_fa3_tuned(spec, Fa3Tuning{}, plan, why_not);
}

} // namespace flashjit
