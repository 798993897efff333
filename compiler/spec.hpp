// KernelSpec: everything that changes generated code, with a canonical name and a stable hash.
#pragma once

#include <flashjit/flashjit.h>

#include <cstdint>
#include <optional>
#include <string>

namespace flashjit {

enum class Op { prefill, decode, combine };
enum class Variant { fa2, fa3, decode_splitk, combine };

const char *op_name(Op op);
const char *variant_name(Variant variant);
const char *dtype_name(flashjit_dtype dtype); // "fp16" | "bf16"

// A compile target: sm_80, sm_86, sm_89, sm_90a. `arch_specific` is the `a` suffix (wgmma, setmaxnreg).
struct Arch {
  int sm = 90;
  bool arch_specific = true;

  std::string name() const;                                  // "sm90a"
  std::string nvrtc_target() const;                          // "sm_90a"
  static std::optional<Arch> parse(const std::string &text); // "sm_90a", "sm90a", "90a", "80"
  static Arch from_compute_capability(int major, int minor); // 9.0 -> sm90a
  bool operator==(const Arch &) const = default;
};

// Largest dynamic shared memory per block (opt-in) for an arch, bytes.
int max_shared_bytes_per_block(const Arch &arch);

struct KernelSpec {
  Op op = Op::prefill;
  Arch arch;
  flashjit_dtype dtype = FLASHJIT_BF16;
  int head_dim_qk = 128;
  int head_dim_v = 128;
  bool causal = false;
  bool local = false; // sliding window
  bool softcap = false;
  bool varlen = false;
  int page_size = 0;    // 0: contiguous KV
  int gqa_group = 0;    // decode: query heads sharing one KV head, packed into one tile
  int q_len = 0;        // decode: max query tokens per sequence
  int align_bytes = 16; // 16: every row start is 16-byte aligned; 2: element-aligned only
  // fa3 prefill: the short-sequence tile's key block (kBlockN), as chosen by fa3_key_block_for()
  // (compiler/planner.hpp): for key lengths the default block pads badly, for short causal sequences
  // (whose three-warpgroup tiles then take two), and for keys too few to split (no tail split); 0: the
  // planner's default.
  int key_block = 0;

  bool operator==(const KernelSpec &) const = default;
};

} // namespace flashjit
