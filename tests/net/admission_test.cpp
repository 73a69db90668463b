// net::Admission: per-address and overall caps on unauthenticated connections evict the oldest (never
// refuse the newcomer), authenticated caps refuse with a reason, every refusal is counted, logs are
// rate-limited.
#include "net/admission.h"

#include <gtest/gtest.h>

#include <vector>

namespace essaim::net {
namespace {

struct Evictions {
  std::vector<std::string> who;
  Admission::Evict on(const std::string& name) {
    return [this, name](const std::string& why) { who.push_back(name + ": " + why); };
  }
};

TEST(Admission, PerAddressCapEvictsTheOldestOfThatAddressOnly) {
  Admission a({.max_unauthenticated = 100, .max_unauthenticated_per_address = 3});
  Evictions ev;
  std::vector<std::unique_ptr<Admission::Ticket>> t;
  t.push_back(a.admit("10.0.0.9", ev.on("other")));
  for (int i = 0; i < 3; ++i) t.push_back(a.admit("10.0.0.1", ev.on("flood" + std::to_string(i))));
  EXPECT_TRUE(ev.who.empty());
  t.push_back(a.admit("10.0.0.1", ev.on("backbone")));  // a fourth from the same address
  ASSERT_EQ(ev.who.size(), 1u);
  EXPECT_EQ(ev.who[0].rfind("flood0: ", 0), 0u) << ev.who[0];
  EXPECT_NE(ev.who[0].find("3 connections from this address"), std::string::npos) << ev.who[0];
  EXPECT_FALSE(t.back()->authenticate());  // the newcomer authenticates
  EXPECT_TRUE(t[1]->authenticate());       // the evicted one cannot
  const AdmissionCounters c = a.counters();
  EXPECT_EQ(c.admitted, 5u);
  EXPECT_EQ(c.evicted_address_full, 1u);
  EXPECT_EQ(c.refused_evicted, 1u);
  EXPECT_EQ(c.live_unauthenticated, 3u);  // other, flood1, flood2
  EXPECT_EQ(c.live_authenticated, 1u);
}

TEST(Admission, OverallCapEvictsTheOldestOfAll) {
  Admission a({.max_unauthenticated = 2, .max_unauthenticated_per_address = 10});
  Evictions ev;
  auto t1 = a.admit("a", ev.on("a"));
  auto t2 = a.admit("b", ev.on("b"));
  auto t3 = a.admit("c", ev.on("c"));
  ASSERT_EQ(ev.who.size(), 1u);
  EXPECT_EQ(ev.who[0].rfind("a: ", 0), 0u);
  EXPECT_EQ(a.counters().evicted_unauthenticated_full, 1u);
  // Authenticated connections do not count against the unauthenticated cap and are never evicted.
  EXPECT_FALSE(t2->authenticate());
  EXPECT_FALSE(t3->authenticate());
  auto t4 = a.admit("d", ev.on("d"));
  auto t5 = a.admit("e", ev.on("e"));
  EXPECT_EQ(ev.who.size(), 1u);
  auto t6 = a.admit("f", ev.on("f"));
  ASSERT_EQ(ev.who.size(), 2u);
  EXPECT_EQ(ev.who[1].rfind("d: ", 0), 0u);
}

TEST(Admission, AuthenticatedCapsRefuseWithAReason) {
  Admission a({.max_authenticated = 2, .max_authenticated_per_address = 1});
  auto t1 = a.admit("x", {});
  auto t2 = a.admit("x", {});
  auto t3 = a.admit("y", {});
  auto t4 = a.admit("z", {});
  EXPECT_FALSE(t1->authenticate());
  std::optional<std::string> no = t2->authenticate();
  ASSERT_TRUE(no);
  EXPECT_NE(no->find("limit 1 per address"), std::string::npos) << *no;
  EXPECT_FALSE(t3->authenticate());
  no = t4->authenticate();
  ASSERT_TRUE(no);
  EXPECT_NE(no->find("limit 2)"), std::string::npos) << *no;
  AdmissionCounters c = a.counters();
  EXPECT_EQ(c.refused_address_full, 1u);
  EXPECT_EQ(c.refused_authenticated_full, 1u);
  EXPECT_EQ(c.refusals(), 2u);
  t1.reset();  // a slot frees when its ticket goes
  EXPECT_FALSE(t4->authenticate());
  c = a.counters();
  EXPECT_EQ(c.live_authenticated, 2u);
  EXPECT_NE(c.to_prometheus("essaim_worker").find("essaim_worker_admission_refused_total{reason=\"address_full\"} 1"),
            std::string::npos)
      << c.to_prometheus("essaim_worker");
}

TEST(Admission, RefusalsAreLoggedAtMostOncePerInterval) {
  std::vector<std::string> lines;
  Admission a({.max_unauthenticated = 1, .log_interval = std::chrono::hours(1)},
              [&](const std::string& l) { lines.push_back(l); });
  std::vector<std::unique_ptr<Admission::Ticket>> t;
  for (int i = 0; i < 50; ++i) t.push_back(a.admit("10.1.1.1", {}));
  EXPECT_EQ(a.counters().evicted_unauthenticated_full, 49u);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("10.1.1.1"), std::string::npos) << lines[0];
  a.note_refused("10.2.2.2", "thread cap");
  EXPECT_EQ(lines.size(), 1u);
  EXPECT_EQ(a.counters().refused_by_server, 1u);
}

}  // namespace
}  // namespace essaim::net
