#include "compiler/spec.hpp"

#include <cctype>
#include <string>

namespace flashjit {

const char *op_name(Op op) {
  switch (op) {
  case Op::prefill: return "prefill";
  case Op::decode: return "decode";
  case Op::combine: return "combine";
  }
  return "?";
}

const char *variant_name(Variant variant) {
  switch (variant) {
  case Variant::fa2: return "fa2";
  case Variant::fa3: return "fa3";
  case Variant::decode_splitk: return "decode_splitk";
  case Variant::combine: return "combine";
  }
  return "?";
}

const char *dtype_name(flashjit_dtype dtype) {
  return dtype == FLASHJIT_FP16 ? "fp16" : "bf16";
}

std::string Arch::name() const {
  return "sm" + std::to_string(sm) + (arch_specific ? "a" : "");
}

std::string Arch::nvrtc_target() const {
  return "sm_" + std::to_string(sm) + (arch_specific ? "a" : "");
}

std::optional<Arch> Arch::parse(const std::string &text) {
  std::string digits = text;
  for (const char *prefix : {"sm_", "sm", "compute_"}) {
    if (digits.rfind(prefix, 0) == 0) {
      digits = digits.substr(std::string(prefix).size());
      break;
    }
  }
  bool suffix = !digits.empty() && digits.back() == 'a';
  if (suffix)
    digits.pop_back();
  if (digits.empty() || digits.size() > 3)
    return std::nullopt;
  for (char c : digits)
    if (!std::isdigit(static_cast<unsigned char>(c)))
      return std::nullopt;
  int sm = std::stoi(digits);
  if (sm != 80 && sm != 86 && sm != 89 && sm != 90)
    return std::nullopt;
  // wgmma/setmaxnreg need the arch-specific target, so sm90 always means sm90a here.
  if (sm == 90)
    suffix = true;
  if (suffix && sm != 90)
    return std::nullopt;
  return Arch{sm, suffix};
}

Arch Arch::from_compute_capability(int major, int minor) {
  int sm = major * 10 + minor;
  if (sm >= 90)
    return Arch{90, true};
  if (sm >= 89)
    return Arch{89, false};
  if (sm >= 86)
    return Arch{86, false};
  return Arch{80, false};
}

int max_shared_bytes_per_block(const Arch &arch) {
  constexpr int kKiB = 1024;
  switch (arch.sm) {
  case 80: return 163 * kKiB;
  case 86:
  case 89: return 99 * kKiB;
  default: return 227 * kKiB;
  }
}

} // namespace flashjit
