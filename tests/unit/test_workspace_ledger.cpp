// What the runtime remembers about caller workspaces: the fa3 tail split's counters are zeroed once
// per workspace (the kernel leaves them zero), again when flashjit_plan asks, and a decode schedule
// and the tail split's counters never both stand for the same memory.
#include "runtime/workspace_ledger.hpp"

#include <gtest/gtest.h>

namespace flashjit {
namespace {

const void *const kWorkspace = reinterpret_cast<const void *>(0x100000);
const void *const kOther = reinterpret_cast<const void *>(0x200000);

TEST(WorkspaceLedger, TailCountersAreZeroedOncePerWorkspace) {
  WorkspaceLedger ledger;
  EXPECT_FALSE(ledger.tail_counters_zero(kWorkspace, 528)) << "first sight: the caller zeroes them";
  EXPECT_TRUE(ledger.tail_counters_zero(kWorkspace, 528)) << "left at zero by the last launch";
  EXPECT_TRUE(ledger.tail_counters_zero(kWorkspace, 264)) << "fewer counters: already zero";
  EXPECT_FALSE(ledger.tail_counters_zero(kWorkspace, 1056)) << "more counters than were zeroed";
  EXPECT_TRUE(ledger.tail_counters_zero(kWorkspace, 1056));
  EXPECT_FALSE(ledger.tail_counters_zero(kOther, 528)) << "another workspace";
  EXPECT_FALSE(ledger.tail_counters_zero(kWorkspace, 528, /*rezero=*/true)) << "flashjit_plan zeroes again";
  EXPECT_TRUE(ledger.tail_counters_zero(kWorkspace, 528));
  ledger.forget(kWorkspace);
  EXPECT_FALSE(ledger.tail_counters_zero(kWorkspace, 528)) << "a failed zeroing is not remembered";
}

TEST(WorkspaceLedger, DecodeScheduleAndTailCountersWriteOverEachOther) {
  WorkspaceLedger ledger;
  EXPECT_FALSE(ledger.schedule(kWorkspace).has_value());
  DecodeSchedule schedule;
  schedule.batch = 64;
  ledger.set_schedule(kWorkspace, schedule);
  ASSERT_TRUE(ledger.schedule(kWorkspace).has_value());
  EXPECT_EQ(ledger.schedule(kWorkspace)->batch, 64);
  EXPECT_FALSE(ledger.tail_counters_zero(kWorkspace, 528)) << "a decode schedule is not zero counters";
  EXPECT_FALSE(ledger.schedule(kWorkspace).has_value()) << "the tail split wrote over the schedule";
  EXPECT_TRUE(ledger.tail_counters_zero(kWorkspace, 528));
  ledger.set_schedule(kWorkspace, schedule);
  EXPECT_FALSE(ledger.tail_counters_zero(kWorkspace, 528)) << "the decode plan wrote over the counters";
}

} // namespace
} // namespace flashjit
