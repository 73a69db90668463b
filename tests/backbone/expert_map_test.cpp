// The expert map: addresses from flags, the JSON file (hostile input: every malformed document is an error
// with a reason, never a crash or an exception), and what is routed to a worker (announced ∩ declared ∩
// replica).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "backbone/expert_map.h"

namespace essaim::backbone {
namespace {

TEST(ExpertMap, AddressesFromFlags) {
  const std::vector<std::string> ok = {"127.0.0.1:9001", "[::1]:9002", "worker.local:80"};
  Result<ExpertMap> m = expert_map_from_addresses(ok);
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  ASSERT_EQ(m->workers.size(), 3u);
  EXPECT_EQ(m->workers[1].address, "[::1]:9002");
  EXPECT_FALSE(m->workers[0].holdings.has_value());
  for (const char* bad : {"127.0.0.1", "127.0.0.1:0", "127.0.0.1:99999", ":9000", "host:port", ""}) {
    const std::vector<std::string> one = {bad};
    Result<ExpertMap> r = expert_map_from_addresses(one);
    EXPECT_FALSE(r.is_ok()) << bad;
    if (!r.is_ok()) {
      EXPECT_NE(r.status().message().find("--worker"), std::string::npos) << r.status().message();
    }
  }
}

TEST(ExpertMap, RelayAddressesNameANode) {
  const std::vector<std::string> ok = {"ws://127.0.0.1:8443/node/w1", "wss://relay.example.org/node/n-00ab"};
  EXPECT_TRUE(expert_map_from_addresses(ok));
  for (const std::string bad : {"ws://127.0.0.1:8443/", "ws://127.0.0.1:8443/node/", "wss://h:0/node/w1",
                                "ws://:1/node/w1", "ws://h:1/node/a/b", "ws://h:99999/node/w1"}) {
    const std::vector<std::string> one = {bad};
    EXPECT_FALSE(expert_map_from_addresses(one)) << bad;
  }
  auto parsed = expert_map_parse(R"({"workers": [{"address": "wss://relay:443/node/w1"}]})");
  ASSERT_TRUE(parsed) << parsed.status().message();
  EXPECT_EQ(parsed->workers[0].address, "wss://relay:443/node/w1");
}

TEST(ExpertMap, ParsesTheDocumentedForm) {
  Result<ExpertMap> m = expert_map_parse(R"({
    "format": "essaim-expert-map", "version": 1,
    "workers": [
      {"address": "10.0.0.2:9000", "label": "phone-1",
       "holdings": [{"layer": 3, "expert_first": 0, "expert_count": 32}, {"layer": 4, "expert_first": 32, "expert_count": 1}]},
      {"address": "10.0.0.3:9000"}
    ]})");
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  ASSERT_EQ(m->workers.size(), 2u);
  EXPECT_EQ(m->workers[0].label, "phone-1");
  ASSERT_TRUE(m->workers[0].holdings.has_value());
  EXPECT_EQ(*m->workers[0].holdings, (std::vector<proto::Holding>{{3, 0, 32}, {4, 32, 1}}));
  EXPECT_FALSE(m->workers[1].holdings.has_value());
  // format and version are optional.
  EXPECT_TRUE(expert_map_parse(R"({"workers": []})").is_ok());
}

TEST(ExpertMap, RefusesMalformedDocumentsWithAReason) {
  const std::pair<const char*, const char*> cases[] = {
      {"", "not valid JSON"},
      {"[1, 2", "not valid JSON"},
      {"[]", "object"},
      {R"({"workers": {}})", "array"},
      {R"({"format": "other", "workers": []})", "format"},
      {R"({"version": 2, "workers": []})", "version"},
      {R"({"workers": [], "extra": 1})", "unknown key"},
      {R"({"workers": [7]})", "object"},
      {R"({"workers": [{}]})", "address"},
      {R"({"workers": [{"address": 9000}]})", "address"},
      {R"({"workers": [{"address": "h"}]})", "HOST:PORT"},
      {R"({"workers": [{"address": "h:1", "port": 2}]})", "unknown key"},
      {R"({"workers": [{"address": "h:1", "holdings": {}}]})", "array"},
      {R"({"workers": [{"address": "h:1", "holdings": [{"layer": 0, "expert_first": 0}]}]})", "expert_count"},
      {R"({"workers": [{"address": "h:1", "holdings": [{"layer": -1, "expert_first": 0, "expert_count": 1}]}]})", "non-negative"},
      {R"({"workers": [{"address": "h:1", "holdings": [{"layer": 1.5, "expert_first": 0, "expert_count": 1}]}]})", "non-negative"},
      {R"({"workers": [{"address": "h:1", "holdings": [{"layer": "1", "expert_first": 0, "expert_count": 1}]}]})", "non-negative"},
      {R"({"workers": [{"address": "h:1", "holdings": [{"layer": 4294967296, "expert_first": 0, "expert_count": 1}]}]})", "too large"},
      {R"({"workers": [{"address": "h:1", "holdings": [{"layer": 0, "expert_first": 0, "expert_count": 0}]}]})", "at least 1"},
      {R"({"workers": [{"address": "h:1", "holdings": [{"layer": 0, "expert_first": 4294967295, "expert_count": 2}]}]})", "2^32"},
      {R"({"workers": [{"address": "h:1", "holdings": [{"layer": 0, "expert_first": 0, "expert_count": 1, "x": 0}]}]})", "unknown key"},
  };
  for (const auto& [doc, why] : cases) {
    Result<ExpertMap> m = expert_map_parse(doc);
    ASSERT_FALSE(m.is_ok()) << doc;
    EXPECT_NE(m.status().message().find(why), std::string::npos) << doc << " -> " << m.status().message();
  }
  EXPECT_FALSE(expert_map_parse(std::string(kMaxMapFileBytes + 1, ' ')).is_ok());
}

// Seeded mutations of a valid document: each is either refused with a message or parsed into addresses
// that passed the HOST:PORT check. Never a crash (this binary also runs under ASan/UBSan).
TEST(ExpertMap, SurvivesMutatedDocuments) {
  const std::string valid =
      R"({"workers": [{"address": "10.0.0.2:9000", "holdings": [{"layer": 3, "expert_first": 0, "expert_count": 32}]}]})";
  std::mt19937_64 rng(5);
  size_t refused = 0, parsed = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string doc = valid;
    const int edits = 1 + int(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % doc.size();
      switch (rng() % 3) {
        case 0: doc[at] = char(rng()); break;
        case 1: doc.erase(at, 1 + rng() % 8); break;
        case 2: doc.insert(at, std::string(1 + rng() % 3, "{[\":,}]0-9e"[rng() % 12])); break;
      }
      if (doc.empty()) doc = "{";
    }
    Result<ExpertMap> m = expert_map_parse(doc);
    if (!m.is_ok()) {
      EXPECT_FALSE(m.status().message().empty());
      ++refused;
      continue;
    }
    ++parsed;
    for (const WorkerEndpoint& w : m->workers) EXPECT_NE(w.address.find(':'), std::string::npos);
  }
  EXPECT_GT(refused, 100u);
  EXPECT_GT(parsed, 10u) << "the mutations never kept a document valid: they do not vary enough";
}

TEST(ExpertMap, LoadsAFileAndNamesItInErrors) {
  const std::string path = (std::filesystem::temp_directory_path() / "essaim-expert-map-test.json").string();
  {
    std::ofstream(path) << R"({"workers": [{"address": "127.0.0.1:7000"}]})";
  }
  Result<ExpertMap> m = expert_map_load(path);
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  EXPECT_EQ(m->workers.at(0).address, "127.0.0.1:7000");
  {
    std::ofstream(path) << R"({"workers": [{"address": "127.0.0.1"}]})";
  }
  m = expert_map_load(path);
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find(path), std::string::npos);
  std::filesystem::remove(path);
  EXPECT_FALSE(expert_map_load(path).is_ok());
}

// A replica store with layers 1 and 3 holding experts [0, 8) (no weights are read by routing).
ExpertStore replica_store(std::vector<float>& backing) {
  constexpr int64_t E = 32, F = 32, X = 8;
  backing.assign(size_t(E * F * X), 0.0f);
  const auto* data = reinterpret_cast<const uint8_t*>(backing.data());
  ExpertLayer::Tensor3d gate{GgmlType::F32, E, F, X, data}, down{GgmlType::F32, F, E, X, data};
  ExpertStore s;
  EXPECT_TRUE(s.add(1, ExpertLayer::separate(gate, gate, down)).is_ok());
  EXPECT_TRUE(s.add(3, ExpertLayer::separate(gate, gate, down)).is_ok());
  return s;
}

TEST(ExpertMap, RoutableIsAnnouncedIntersectDeclaredIntersectReplica) {
  std::vector<float> backing;
  const ExpertStore replica = replica_store(backing);
  const std::vector<proto::Holding> announced = {{1, 0, 4}, {1, 6, 10}, {2, 0, 8}, {3, 2, 3}};
  // No declaration: what the worker announced, clipped to the replica (layer 2 absent, 1: [6, 8)).
  EXPECT_EQ(routable_holdings(announced, std::nullopt, replica),
            (std::vector<proto::Holding>{{1, 0, 4}, {1, 6, 2}, {3, 2, 3}}));
  // Declared: only the overlap.
  const std::vector<proto::Holding> declared = {{1, 2, 5}, {3, 0, 3}};
  EXPECT_EQ(routable_holdings(announced, declared, replica),
            (std::vector<proto::Holding>{{1, 2, 2}, {1, 6, 1}, {3, 2, 1}}));
  EXPECT_TRUE(routable_holdings(announced, std::vector<proto::Holding>{}, replica).empty());
  // Ranges near 2^32 do not overflow.
  EXPECT_TRUE(routable_holdings(std::vector<proto::Holding>{{1, 0xFFFFFFF0u, 16}}, std::nullopt, replica).empty());

  const std::vector<proto::Holding> r = routable_holdings(announced, declared, replica);
  EXPECT_TRUE(holdings_contain(r, 1, 3));
  EXPECT_FALSE(holdings_contain(r, 1, 4));
  EXPECT_TRUE(holdings_contain(r, 1, 6));
  EXPECT_FALSE(holdings_contain(r, 1, 7));
  EXPECT_FALSE(holdings_contain(r, 2, 0));
  EXPECT_EQ(holdings_text(r), "layer 1 experts 2-3, layer 1 experts 6-6, layer 3 experts 2-2");
}

}  // namespace
}  // namespace essaim::backbone
