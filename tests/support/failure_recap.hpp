// The current test's failures, for printing after the daemons' logs: where
// only a log's tail is kept (the CI's), the failures above the logs are lost.
#pragma once

#include <gtest/gtest.h>

#include <string>

namespace tiermem::test {

inline std::string failure_recap() {
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  if (test == nullptr || test->result() == nullptr) return "";
  std::string out;
  const ::testing::TestResult& result = *test->result();
  for (int i = 0; i < result.total_part_count(); ++i) {
    const ::testing::TestPartResult& part = result.GetTestPartResult(i);
    if (!part.failed()) continue;
    out += "--- failure of " + std::string(test->test_suite_name()) + "." + test->name() + " at " +
           (part.file_name() != nullptr ? part.file_name() : "?") + ":" + std::to_string(part.line_number()) +
           " ---\n" + std::string(part.message()).substr(0, 2000) + "\n";
  }
  return out;
}

}  // namespace tiermem::test
