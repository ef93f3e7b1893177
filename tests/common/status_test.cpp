// Status and Result: the contract of the public error vocabulary.
#include <gtest/gtest.h>

#include <tiermem/status.h>

namespace tiermem {
namespace {

TEST(StatusTest, CodesHaveStableNamesAndMessagesKeepContext) {
  Status s(ErrorCode::not_allocated, "GVA 0001:0000000000200000 is not allocated");
  EXPECT_EQ(s.to_string(), "not_allocated: GVA 0001:0000000000200000 is not allocated");
  EXPECT_EQ(s.with_context("read").message(), "read: GVA 0001:0000000000200000 is not allocated");
  EXPECT_EQ(s.with_context("read").code(), ErrorCode::not_allocated);
  EXPECT_EQ(Status().to_string(), "ok");
  EXPECT_EQ(error_code_name(ErrorCode::config_error), "config_error");
  EXPECT_EQ(error_code_name(static_cast<ErrorCode>(999)), "unknown_error");
}

TEST(ResultTest, HoldsAValueOrAnError) {
  Result<int> good(7);
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(*good, 7);
  EXPECT_TRUE(good.status().ok());
  Result<int> bad(ErrorCode::not_found, "no such name");
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), ErrorCode::not_found);
  EXPECT_EQ(bad.value_or(3), 3);
}

TEST(ResultTest, AnOkStatusIsNotAValue) {
  Result<int> r{Status()};
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::internal);
}

// value() of an error is a documented precondition violation: the process
// stops with the status's message, in every build type (this test runs in
// the release-like build tools/setup.sh makes, as in a debug one).
TEST(ResultDeathTest, ValueOfAnErrorStopsWithTheMessage) {
  Result<int> bad(ErrorCode::not_found, "no allocation is named 'w'");
  EXPECT_DEATH((void)bad.value(), "value\\(\\) of an error result: not_found: no allocation is named 'w'");
  EXPECT_DEATH((void)*bad, "not_found");
  Result<std::string> text(ErrorCode::io_error, "disk");
  EXPECT_DEATH((void)text->size(), "io_error: disk");
}

}  // namespace
}  // namespace tiermem
