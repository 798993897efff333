// The split-K decode kernel's unit of work: Unit, decoded from one host-written fj_decode_work entry
// (sequence, kv head, m block, the piece's keys and its partial-state slot), and the entry's load.
// Read by the piece loop, the copies, the logits' key ranges and the merges.
#pragma once

#include "kernels/decode/traits.cuh"
#include "params_decode.h"
#include "prim/ld_global.cuh"
#include "prim/types.cuh"

namespace fj::decode {

// ---- one unit of work, decoded -------------------------------------------------------------------

struct Unit {
  int batch, head_kv, m_block;
  int kv_begin, kv_end, state;
  int kv_len;    // keys of the sequence (causal / window are relative to its end)
  int rows_here; // packed query rows of this m block that exist
};

// The unit of `w` without its KV length (the merge needs none; the length is a load).
__device__ __forceinline__ Unit decode_unit_rows(const fj_decode_params &p, const fj_decode_work &w) {
  Unit u;
  u.m_block = w.unit % p.m_blocks;
  const int pair = w.unit / p.m_blocks;
  u.head_kv = pair % p.attn.heads_kv;
  u.batch = pair / p.attn.heads_kv;
  u.kv_begin = w.kv_begin;
  u.kv_end = w.kv_end;
  u.state = w.state;
  u.kv_len = 0;
  const int rows = Cfg::kGqaGroup * p.attn.seqlen_q;
  const int first = u.m_block * Cfg::kBlockM;
  u.rows_here = rows - first < Cfg::kBlockM ? rows - first : Cfg::kBlockM;
  return u;
}

__device__ __forceinline__ Unit decode_unit(const fj_decode_params &p, const fj_decode_work &w) {
  Unit u = decode_unit_rows(p, w);
  u.kv_len = p.attn.maybe_seqlens_k != nullptr ? ld_global_nc_s32(p.attn.maybe_seqlens_k + u.batch) : p.attn.seqlen_k;
  return u;
}

__device__ __forceinline__ fj_decode_work load_work(const fj_decode_work *work) {
  i32 raw[4];
  ld_global_nc_v4_s32(raw, work);
  return {raw[0], raw[1], raw[2], raw[3]};
}

} // namespace fj::decode
