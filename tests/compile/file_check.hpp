// FileCheck-style string checks for generator stages (MLIR IR, PTX), shared by the compile tests.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace flashjit::testing {

// At most this much of the checked text goes into a failure message (PTX runs to megabytes).
inline constexpr size_t kFailureExcerptChars = 2000;

inline std::string excerpt(const std::string &text) {
  return text.size() <= kFailureExcerptChars ? text : text.substr(0, kFailureExcerptChars) + "\n[...]";
}

// FileCheck's CHECK: each pattern must appear, in order, after the previous match.
inline ::testing::AssertionResult check_in_order(const std::string &text, const std::vector<std::string> &patterns) {
  size_t at = 0;
  for (const std::string &pattern : patterns) {
    const size_t found = text.find(pattern, at);
    if (found == std::string::npos)
      return ::testing::AssertionFailure() << "CHECK: '" << pattern << "' not found after offset " << at << " in:\n"
                                           << excerpt(text);
    at = found + pattern.size();
  }
  return ::testing::AssertionSuccess();
}

// FileCheck's CHECK-NOT over the whole text.
inline ::testing::AssertionResult check_not(const std::string &text, const std::vector<std::string> &patterns) {
  for (const std::string &pattern : patterns)
    if (text.find(pattern) != std::string::npos)
      return ::testing::AssertionFailure() << "CHECK-NOT: '" << pattern << "' found in:\n" << excerpt(text);
  return ::testing::AssertionSuccess();
}

} // namespace flashjit::testing
