#include <gtest/gtest.h>

#include <tiermem/gva.h>

namespace tiermem {
namespace {

TEST(GvaTest, FormatsNodeAndOffsetInFixedWidthHex) {
  Gva g;
  g.node = 1;
  g.offset = 0x7f8a2b3c4d5eULL;
  EXPECT_EQ(g.to_string(), "0001:00007f8a2b3c4d5e");
  g.node = 0xabcd;
  g.offset = ~uint64_t{0};
  EXPECT_EQ(g.to_string(), "abcd:ffffffffffffffff");
}

TEST(GvaTest, ParseRoundTripsFormat) {
  for (uint64_t offset : {uint64_t{0}, uint64_t{1}, uint64_t{0x200000}, uint64_t{0xdeadbeefcafef00d}, ~uint64_t{0}}) {
    for (NodeId node : {NodeId{0}, NodeId{1}, NodeId{0x1234}, NodeId{0xffff}}) {
      Gva g;
      g.node = node;
      g.offset = offset;
      auto parsed = Gva::parse(g.to_string());
      ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
      EXPECT_EQ(parsed->node, node);
      EXPECT_EQ(parsed->offset, offset);
      EXPECT_EQ(parsed->generation, 0u) << "text carries no generation";
    }
  }
}

TEST(GvaTest, ParseAcceptsUpperCaseHex) {
  auto g = Gva::parse("00AB:00000000DEADBEEF");
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->node, 0xab);
  EXPECT_EQ(g->offset, 0xdeadbeefULL);
}

TEST(GvaTest, ParseRejectsMalformedTextWithClearMessage) {
  const char* bad[] = {"",
                       "0001",
                       "0001-0000000000000000",
                       "001:0000000000000000",
                       "00001:0000000000000000",
                       "0001:000000000000000",
                       "0001:00000000000000000",
                       "000g:0000000000000000",
                       "0001:000000000000000x",
                       " 0001:0000000000000000",
                       "0001:0000000000000000 ",
                       "0001::000000000000000"};
  for (const char* text : bad) {
    auto g = Gva::parse(text);
    ASSERT_FALSE(g.ok()) << "accepted '" << text << "'";
    EXPECT_EQ(g.status().code(), ErrorCode::bad_gva);
    EXPECT_NE(g.status().message().find(std::string("'") + text + "'"), std::string::npos)
        << "message should quote the input: " << g.status().message();
    EXPECT_NE(g.status().message().find("NNNN:OOOOOOOOOOOOOOOO"), std::string::npos);
  }
}

TEST(GvaTest, NullAndPlus) {
  Gva g;
  EXPECT_TRUE(g.is_null());
  g.node = 3;
  g.generation = 9;
  g.offset = 0x1000;
  const Gva h = g.plus(0x10);
  EXPECT_EQ(h.offset, 0x1010u);
  EXPECT_EQ(h.node, 3);
  EXPECT_EQ(h.generation, 9u);
  EXPECT_FALSE(h.is_null());
}

}  // namespace
}  // namespace tiermem
