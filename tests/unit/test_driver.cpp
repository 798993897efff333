// The driver loader on a machine without an NVIDIA driver: every entry point fails cleanly with a
// message that says so, and nothing crashes. (On a machine with a driver these tests skip.)
#include "runtime/driver.hpp"
#include "runtime/module.hpp"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

namespace {

// True where a working driver answers; these tests are about machines without one (or with only
// the toolkit's stub libcuda, which is reported the same way).
bool driver_works() {
  return flashjit::driver::api() != nullptr;
}

} // namespace

TEST(Driver, AbsentDriverGivesAClearError) {
  if (driver_works()) {
    GTEST_SKIP() << "a working NVIDIA driver is present here";
  }
  std::string error;
  EXPECT_EQ(flashjit::driver::api(&error), nullptr);
  // "no NVIDIA driver: libcuda.so.1 could not be loaded (...)", or "... is the CUDA toolkit's stub".
  EXPECT_NE(error.find("no NVIDIA driver"), std::string::npos) << error;
  EXPECT_NE(error.find("libcuda.so.1"), std::string::npos) << error;
  EXPECT_EQ(flashjit::driver::api(), nullptr); // no error pointer: still fine

  // First use from many threads at once: one answer, no crash.
  constexpr int kThreads = 8;
  std::vector<std::thread> threads;
  std::vector<std::string> errors(kThreads);
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] { EXPECT_EQ(flashjit::driver::api(&errors[i]), nullptr); });
  }
  for (auto &thread : threads) {
    thread.join();
  }
  for (const std::string &e : errors) {
    EXPECT_EQ(e, error);
  }
}

TEST(Driver, EverythingAboveTheDriverFailsCleanlyWithoutIt) {
  if (driver_works()) {
    GTEST_SKIP() << "a working NVIDIA driver is present here";
  }
  flashjit::driver::DeviceInfo info;
  flashjit::Status status = flashjit::driver::current_device(&info);
  EXPECT_EQ(status.code, FLASHJIT_DRIVER_ERROR);
  EXPECT_NE(status.message.find("no NVIDIA driver"), std::string::npos) << status.message;
  const flashjit::driver::DeviceInfo *cached = nullptr;
  status = flashjit::driver::context_device(nullptr, &cached);
  EXPECT_EQ(status.code, FLASHJIT_DRIVER_ERROR);
  EXPECT_NE(status.message.find("no NVIDIA driver"), std::string::npos) << status.message;
  EXPECT_EQ(cached, nullptr);

  const std::vector<char> cubin(128, 0);
  flashjit::LoadedKernel kernel;
  status = flashjit::LoadedKernel::load(cubin, "kernel", 0, &kernel);
  EXPECT_EQ(status.code, FLASHJIT_DRIVER_ERROR);
  EXPECT_FALSE(kernel.loaded());
  status = kernel.launch({1, 1, 1}, {128, 1, 1}, 0, nullptr, nullptr);
  EXPECT_FALSE(status.ok());

  flashjit::LoadedKernel moved = std::move(kernel); // moving and destroying empty kernels is fine
  EXPECT_FALSE(moved.loaded());
}

TEST(Driver, ErrorTextOfKnownCodes) {
  EXPECT_EQ(flashjit::driver::error_text(CUDA_ERROR_OUT_OF_MEMORY).rfind("CUDA_ERROR_OUT_OF_MEMORY (", 0), 0u);
  EXPECT_EQ(flashjit::driver::error_text(CUDA_ERROR_INVALID_IMAGE).rfind("CUDA_ERROR_INVALID_IMAGE (", 0), 0u);
  const std::string unknown = flashjit::driver::error_text(static_cast<CUresult>(987654));
  EXPECT_NE(unknown.find("987654"), std::string::npos) << unknown;

  const flashjit::Status status = flashjit::driver::driver_error("cuModuleLoadData(k)", CUDA_ERROR_NO_BINARY_FOR_GPU);
  EXPECT_EQ(status.code, FLASHJIT_DRIVER_ERROR);
  EXPECT_EQ(status.message.rfind("cuModuleLoadData(k): CUDA_ERROR_NO_BINARY_FOR_GPU (", 0), 0u) << status.message;
}
