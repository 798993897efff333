// Builds a few decode_splitk specs with the MLIR backend and with NVRTC (same plan) and writes, per
// spec, into the directory given as argv[1]: <tag>.{built,lowered}.mlir, <tag>.{mlir,nvrtc}.{ptx,cubin},
// <tag>.mlir.log (ptxas report) and <tag>.meta (the plan line tests/mlir_parity/check_decode.cpp
// reads: it has no planner; its fields page_size and align_bytes say which K/V layout to build:
// paged through a shuffled block table, and/or element-aligned with odd strides and base offsets;
// the last, kFusedMerge, whether the combine is launched at all). Run by
// scripts/make-mlir-parity.sh where LLVM/MLIR is.
#include "compiler/build.hpp"
#include "compiler/mlir/mlir_backend.hpp"
#include "compiler/planner.hpp"

#include <chrono>
#include <cstdio>
#include <fstream>

using namespace flashjit;

static void write(const std::string &path, const std::string &text) {
  std::ofstream(path, std::ios::binary) << text;
}
static void write(const std::string &path, const std::vector<char> &bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
}

int main(int argc, char **argv) {
  const std::string dir = argc > 1 ? argv[1] : "out";
  struct Case {
    const char *tag;
    Arch arch;
    int dqk, dv;
    flashjit_dtype dtype;
    int group, q_len;
    bool causal, local, softcap;
    int page_size = 0, align_bytes = 16;
  };
  const Case cases[] = {
      {"sm90a.d128.bf16.g1.q1", {90, true}, 128, 128, FLASHJIT_BF16, 1, 1, false, false, false},
      {"sm90a.d128.bf16.g8.q1", {90, true}, 128, 128, FLASHJIT_BF16, 8, 1, false, false, false},
      {"sm90a.d64.fp16.g4.q4.causal", {90, true}, 64, 64, FLASHJIT_FP16, 4, 4, true, false, false},
      {"sm90a.d128.bf16.g8.q1.local.softcap", {90, true}, 128, 128, FLASHJIT_BF16, 8, 1, false, true, true},
      {"sm90a.d256.bf16.g4.q2.causal", {90, true}, 256, 256, FLASHJIT_BF16, 4, 2, true, false, false},
      // paged KV (block table shuffled by the checker), element-aligned rows, head dims of 8 mod 16
      {"sm90a.d128.bf16.g4.q1.page16", {90, true}, 128, 128, FLASHJIT_BF16, 4, 1, false, false, false, 16},
      {"sm90a.d128.bf16.g8.q1.page1", {90, true}, 128, 128, FLASHJIT_BF16, 8, 1, false, false, false, 1},
      {"sm90a.d128.fp16.g4.q4.causal.page7", {90, true}, 128, 128, FLASHJIT_FP16, 4, 4, true, false, false, 7},
      {"sm90a.d128.bf16.g4.q1.align2", {90, true}, 128, 128, FLASHJIT_BF16, 4, 1, false, false, false, 0, 2},
      {"sm90a.d72.bf16.g4.q1", {90, true}, 72, 72, FLASHJIT_BF16, 4, 1, false, false, false},
      {"sm90a.d72.fp16.g6.q4.causal.local.softcap.page16.align2",
       {90, true},
       72,
       72,
       FLASHJIT_FP16,
       6,
       4,
       true,
       true,
       true,
       16,
       2},
  };
  for (const Case &c : cases) {
    KernelSpec spec;
    spec.op = Op::decode;
    spec.arch = c.arch;
    spec.head_dim_qk = c.dqk;
    spec.head_dim_v = c.dv;
    spec.dtype = c.dtype;
    spec.gqa_group = c.group;
    spec.q_len = c.q_len;
    spec.causal = c.causal;
    spec.local = c.local;
    spec.softcap = c.softcap;
    spec.page_size = c.page_size;
    spec.align_bytes = c.align_bytes;
    Plan plan;
    std::string why;
    if (!plan_decode(spec, &plan, &why, FLASHJIT_BACKEND_MLIR)) {
      std::printf("plan: %s\n", why.c_str());
      return 1;
    }
    const std::string name = kernel_name(spec, plan), base = dir + "/" + c.tag;
    mlirgen::Stages st;
    Status s = mlirgen::generate(spec, plan, {}, &st);
    if (!s) {
      std::printf("%s: %s\n", name.c_str(), s.message.c_str());
      return 1;
    }
    write(base + ".built.mlir", st.built);
    write(base + ".lowered.mlir", st.lowered);
    write(base + ".mlir.ptx", st.ptx);
    CompiledKernel mk, nk;
    auto t0 = std::chrono::steady_clock::now();
    s = build_kernel(spec, plan, FLASHJIT_BACKEND_MLIR, &mk);
    const double mlir_total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!s) {
      std::printf("%s: %s\n", name.c_str(), s.message.c_str());
      return 1;
    }
    write(base + ".mlir.cubin", mk.cubin);
    write(base + ".mlir.log", mk.log);
    s = build_kernel(spec, plan, FLASHJIT_BACKEND_NVRTC, &nk);
    if (!s) {
      std::printf("%s: %s\n", name.c_str(), s.message.c_str());
      return 1;
    }
    write(base + ".nvrtc.cubin", nk.cubin);
    write(base + ".nvrtc.ptx", nk.ptx);
    // What check_decode needs of the plan (it has no planner): one line of integers.
    write(base + ".meta",
          std::to_string(plan.threads) + " " + std::to_string(plan.smem_bytes) + " " +
              std::to_string(plan.constant("kBlockM")) + " " + std::to_string(plan.constant("kBlockN")) + " " +
              std::to_string(plan.constant("kMBlocks")) + " " + std::to_string(plan.constant("kCtasPerSm")) + " " +
              std::to_string(plan.constant("kCombineThreads")) + " " + std::to_string(c.dqk) + " " +
              std::to_string(c.dv) + " " + std::to_string(c.group) + " " + std::to_string(c.q_len) + " " +
              std::to_string(int(c.causal)) + " " + std::to_string(int(c.local)) + " " +
              std::to_string(int(c.softcap)) + " " + std::to_string(c.dtype == FLASHJIT_BF16 ? 1 : 0) + " " +
              std::to_string(c.page_size) + " " + std::to_string(c.align_bytes) + " " +
              std::to_string(plan.constant("kFusedMerge", 0)) + "\n");
    std::printf("%-40s %s | mlir: build %.1f ms, lower %.1f ms, ptx %.1f ms, total with ptxas %.1f ms, %d regs, "
                "spill %d/%d | nvrtc: %.1f ms, %d regs\n",
                c.tag, name.c_str(), st.build_seconds * 1e3, st.lower_seconds * 1e3, st.ptx_seconds * 1e3,
                mlir_total * 1e3, mk.resources.registers, mk.resources.spill_store_bytes, mk.resources.spill_load_bytes,
                nk.compile_seconds * 1e3, nk.resources.registers);
  }
  return 0;
}
