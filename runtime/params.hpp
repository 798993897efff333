// Fills the kernel parameter block shared with the templates from a validated problem.
#pragma once

#include "kernel_params.h"
#include "runtime/problem.hpp"

namespace flashjit {

fj_attention_params make_attention_params(const NormalizedProblem &problem);

} // namespace flashjit
