// The request parsers against good and hostile bodies, and the Range header's every form.
#include <gtest/gtest.h>

#include "coord/api_parse.h"

namespace essaim::coord {
namespace {

const std::string kSha(64, 'a');

std::string coverage(const std::string& holdings, const std::string& extra = "") {
  return R"({"node_id": "n-0123456789abcdef", "address": "127.0.0.1:9000", "fingerprint": {"model_identity": ")" +
         kSha + R"(", "protocol_version": 2, "kernel_abi": "1"}, "holdings": )" + holdings +
         R"(, "capacity_bytes": 1073741824, "load": 0.25)" + extra + "}";
}

TEST(ApiParse, Coverage) {
  auto r = parse_coverage(coverage(R"([{"layer": 3, "expert_first": 32, "expert_count": 32, "sha256": ")" + kSha + "\"}]"));
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_EQ(r->holdings.size(), 1u);
  EXPECT_EQ(r->holdings[0].expert_first, 32);
  EXPECT_EQ(r->kernel_abi, "1");
  EXPECT_DOUBLE_EQ(r->load, 0.25);
  for (const std::string bad : {std::string("{"), std::string("[]"), std::string("null"), coverage("{}"),
                                coverage(R"([{"layer": -1, "expert_first": 0, "expert_count": 1, "sha256": ")" + kSha + "\"}]"),
                                coverage(R"([{"layer": 1, "expert_first": 0, "expert_count": 0, "sha256": ")" + kSha + "\"}]"),
                                coverage(R"([{"layer": 1, "expert_first": 0, "expert_count": 1, "sha256": "ab"}])"),
                                coverage(R"([{"layer": 1.5, "expert_first": 0, "expert_count": 1, "sha256": ")" + kSha + "\"}]"),
                                coverage(R"([{"layer": 18446744073709551615, "expert_first": 0, "expert_count": 1}])")}) {
    EXPECT_FALSE(parse_coverage(bad)) << bad;
  }
  auto no_id = parse_coverage(R"({"node_id": "n-../../etc", "address": "a"})");
  ASSERT_FALSE(no_id);
  EXPECT_NE(no_id.status().message().find("node_id"), std::string::npos);
}

// One range listed twice is refused with the two indices; the same layer with another range is not a repeat.
TEST(ApiParse, ARepeatedHoldingIsRefused) {
  const std::string h = R"({"layer": 3, "expert_first": 32, "expert_count": 32, "sha256": ")" + kSha + "\"}";
  const std::string other = R"({"layer": 3, "expert_first": 0, "expert_count": 32, "sha256": ")" + kSha + "\"}";
  auto twice = parse_coverage(coverage("[" + h + ", " + other + ", " + h + "]"));
  ASSERT_FALSE(twice);
  EXPECT_EQ(twice.status().message(), "holdings[2] repeats holdings[0] (layer 3, experts 32-63): list each range once");
  auto distinct = parse_coverage(coverage("[" + h + ", " + other + "]"));
  ASSERT_TRUE(distinct) << distinct.status().message();
  EXPECT_EQ(distinct->holdings.size(), 2u);
  EXPECT_FALSE(parse_volunteer(R"({"node_id": "n-0123456789abcdef", "budget_bytes": 1, "holding": [)"
                               R"({"layer": 0, "expert_first": 0, "expert_count": 4}, {"layer": 0, "expert_first": 0, "expert_count": 4}]})"));
}

TEST(ApiParse, VolunteerUsageWork) {
  auto v = parse_volunteer(R"({"node_id": "n-0123456789abcdef", "budget_bytes": 268435456})");
  ASSERT_TRUE(v);
  EXPECT_FALSE(v->has_holding);
  EXPECT_FALSE(parse_volunteer(R"({"node_id": "n-0123456789abcdef", "budget_bytes": -1})"));
  auto u = parse_usage(R"({"layers": [{"layer": 3, "counts": [1, 2, 3, 4]}]})", 4);
  ASSERT_TRUE(u);
  EXPECT_EQ(u->at(0).counts[3], 4);
  EXPECT_FALSE(parse_usage(R"({"layers": [{"layer": 3, "counts": [1, 2, 3]}]})", 4));
  EXPECT_FALSE(parse_usage(R"({"layers": [{"layer": 3, "counts": [1, -2, 3, 4]}]})", 4));
  auto w = parse_work(R"({"reports": [{"address": "h:1", "pairs_accepted": 5, "audits": 2, "audits_failed": 1}]})");
  ASSERT_TRUE(w);
  EXPECT_EQ(w->at(0).audits_failed, 1);
  EXPECT_FALSE(parse_work(R"({"reports": [{"address": "h:1", "pairs_accepted": 5, "audits": 0, "audits_failed": 1}]})"));
  EXPECT_FALSE(parse_register(R"({"name": ""})"));
  EXPECT_FALSE(parse_register("{\"name\": \"a\\u0001b\"}"));
  EXPECT_EQ(parse_register(R"({"name": "phone-7"})")->name, "phone-7");
  EXPECT_EQ(parse_register(R"({"name": "phone-7"})")->role, "worker");
  EXPECT_EQ(parse_register(R"({"name": "b", "role": "backbone"})")->role, "backbone");
  EXPECT_FALSE(parse_register(R"({"name": "b", "role": "admin"})"));
  EXPECT_FALSE(parse_register(R"({"name": "b", "role": 1})"));
}

TEST(ApiParse, RangeHeader) {
  using K = ByteRange;
  auto r = parse_range_header("bytes=0-99", 1000);
  EXPECT_EQ(r.kind, K::PARTIAL);
  EXPECT_EQ(r.last, 99u);
  r = parse_range_header("bytes=900-", 1000);
  EXPECT_EQ(r.kind, K::PARTIAL);
  EXPECT_EQ(r.first, 900u);
  EXPECT_EQ(r.last, 999u);
  r = parse_range_header("bytes=-10", 1000);
  EXPECT_EQ(r.first, 990u);
  r = parse_range_header("bytes=500-5000", 1000);  // clamped to the end
  EXPECT_EQ(r.last, 999u);
  EXPECT_EQ(parse_range_header("", 1000).kind, K::WHOLE);
  EXPECT_EQ(parse_range_header("bytes=1000-", 1000).kind, K::UNSATISFIABLE);
  EXPECT_EQ(parse_range_header("bytes=-0", 1000).kind, K::UNSATISFIABLE);
  for (const char* bad : {"bytes=5-1", "bytes=a-b", "items=0-1", "bytes=0-1,5-6", "bytes=", "bytes=-", "bytes=--1",
                          "bytes=99999999999999999999-", "bytes= 0-1"}) {
    EXPECT_EQ(parse_range_header(bad, 1000).kind, K::MALFORMED) << bad;
  }
}

}  // namespace
}  // namespace essaim::coord
