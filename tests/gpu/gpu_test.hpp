// The fixture of the GPU tests: an open device session, or the test is skipped (loudly) where no GPU is.
#pragma once

#include "tests/harness/device_case.hpp"

#include <gtest/gtest.h>

namespace flashjit {

class GpuTest : public ::testing::Test {
protected:
  void SetUp() override {
    if (Status s = session_.open(0); !s)
      GTEST_SKIP() << "no GPU: " << s.message;
  }
  harness::DeviceSession session_;
};

} // namespace flashjit
