// Generator for the NVRTC backend: renders a plan into a translation unit (KernelConfig + #include).
#pragma once

#include "compiler/plan.hpp"

#include <string>

namespace flashjit {

// Template file (relative to templates/) that implements a variant.
const char *kernel_template_path(Variant variant);

// The generated source: a KernelConfig of every spec and plan constant, then the kernel template.
std::string render_source(const KernelSpec &spec, const Plan &plan);

} // namespace flashjit
