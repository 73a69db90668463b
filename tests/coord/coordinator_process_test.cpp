// The `essaim coordinator` binary itself: it cuts the plan of a synthetic model into an empty slices
// directory, serves downloads whose bytes match the manifest, shows registered, heartbeating nodes on the
// dashboard in headless Chromium (screenshot under the build dir), and — killed with SIGKILL in the middle
// of heartbeats and work reports, then restarted on the same database — has lost no acknowledged write
// (SQLite and PostgreSQL).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>
#include <thread>

#include "slice/model_identity.h"
#include "slice/slice_manifest.h"
#include "http_client.h"
#include "child_process.h"
#include "pg_cluster.h"
#include "skip.h"
#include "temp_dir.h"

extern char** environ;

namespace essaim::coord {
namespace {

using testing::Reply;
using testing::request;
using json = nlohmann::json;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

const std::string kAdmin = "process-test-admin-token-0123";
const std::string kEssaim = std::string(ESSAIM_BINARY_DIR) + "/src/cli/essaim";

// `essaim coordinator` as a child process; its first start cuts the slice plan, hence the longer wait.
class CoordProcess : public test_support::ListeningProcess {
 public:
  explicit CoordProcess(std::vector<std::string> args) : ListeningProcess(std::move(args), std::chrono::seconds(120)) {}
};

class CoordinatorProcess : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = essaim::testing::make_temp_dir("essaim-coordproc");
    model_ = (dir_ / "tiny.gguf").string();
    const std::string cmd = kEssaim + " synth --arch qwen3moe --preset tiny --types q4_k_m --seed 3 -o " + model_ + " >/dev/null 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  std::vector<std::string> args(const std::string& slices, const std::string& db) {
    return {kEssaim, "coordinator", "--model", model_, "--slices", slices, "--db", db, "--listen", "127.0.0.1:0",
            "--admin-token", kAdmin, "--replicas", "1", "--heartbeat-s", "30", "--slice-experts", "4"};
  }
  static json heartbeat_body(const std::string& id, const json& model, const json& holdings, int port) {
    return {{"node_id", id}, {"address", "127.0.0.1:" + std::to_string(port)},
            {"fingerprint", {{"model_identity", model["model_identity"]}, {"protocol_version", model["protocol_version"]},
                             {"kernel_abi", model["kernel_abi"]}}},
            {"holdings", holdings}, {"capacity_bytes", 1 << 30}, {"load", 0.125 * (port - 9000)}};
  }
  static inline fs::path dir_;
  static inline std::string model_;
};

// Chromium's DOM of `url` once its scripts ran (virtual time), or "" when it failed.
std::string chromium_dom(const fs::path& dir, const std::string& url) {
  const std::string dom_file = (dir / "dom.html").string();
  const std::string flags = "--headless --no-sandbox --disable-gpu --no-first-run --user-data-dir=" + (dir / "chrome").string() +
                            " --virtual-time-budget=5000 ";
  const std::string dump = "timeout 90 chromium " + flags + "--dump-dom '" + url + "' > " + dom_file + " 2>/dev/null";
  if (std::system(dump.c_str()) != 0) return "";
  std::stringstream dom;
  dom << std::ifstream(dom_file).rdbuf();
  return dom.str();
}

size_t count_in(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = 0; (at = text.find(needle, at)) != std::string::npos; ++at) ++n;
  return n;
}

// A backbone registers and reports usage (n_experts x 10 tokens' picks in layer 0) and 4000 pairs phone-1
// (address 127.0.0.1:9000) served with 3 audits.
void backbone_reports(uint16_t port, const json& model) {
  Reply bb = request(port, "POST", "/api/nodes", R"({"name": "backbone-1", "role": "backbone"})", kAdmin);
  ASSERT_EQ(bb.status, 201);
  json counts = json::array();
  for (int64_t e = 0; e < model["n_experts"].get<int64_t>(); ++e) counts.push_back(model["n_expert_used"].get<int64_t>() * 10);
  ASSERT_EQ(request(port, "POST", "/api/expert-usage", json{{"layers", {{{"layer", 0}, {"counts", counts}}}}}.dump(),
                    bb.j()["token"]).status, 200);
  ASSERT_EQ(request(port, "POST", "/api/work",
                    R"({"reports": [{"address": "127.0.0.1:9000", "pairs_accepted": 4000, "audits": 3, "audits_failed": 0}]})",
                    bb.j()["token"]).status, 200);
}

// The public page once its scripts ran: phone-1 and laptop-2 active, server-3 stale, backbone-1 apart.
void check_public_dom(const std::string& dom) {
  for (const char* name : {"phone-1", "laptop-2", "server-3", "backbone-1"}) EXPECT_NE(dom.find(name), std::string::npos) << name;
  EXPECT_EQ(count_in(dom, "class=\"node\""), 4u) << dom;
  EXPECT_EQ(count_in(dom, "data-role=\"backbone\""), 1u) << "backbones apart from workers";
  EXPECT_EQ(count_in(dom, "data-status=\"stale\" data-role=\"worker\""), 1u) << "server-3 is stale\n" << dom;
  EXPECT_EQ(count_in(dom, "data-status=\"active\" data-role=\"worker\""), 2u) << dom;
  EXPECT_EQ(count_in(dom, "class=\"holdings struck\">L"), 1u) << "server-3's holdings struck out\n" << dom;
  EXPECT_EQ(count_in(dom, "class=\"holdings\">L"), 2u) << dom;
  EXPECT_NE(dom.find("s ago</td>"), std::string::npos) << "last seen";
  EXPECT_NE(dom.find("<td>4000</td><td>3</td><td>0</td>"), std::string::npos) << "phone-1's pairs credited and audits";
  EXPECT_NE(dom.find("class=\"layer\""), std::string::npos);
  EXPECT_NE(dom.find("class=\"scarce\""), std::string::npos);  // most ranges have no holder
  EXPECT_NE(dom.find("class=\"tick\" data-state=\"uncovered\""), std::string::npos) << "the coverage strip";
  EXPECT_EQ(dom.find("127.0.0.1:9000"), std::string::npos) << "no addresses on the public page";
  EXPECT_NE(dom.find("(admin only)"), std::string::npos);
  // Rates: the backbone ran n_experts x 10 tokens, phone-1 served 4000 pairs, within the last minute.
  const std::regex tokens(R"(class="tokens">([0-9.]+)<)"), pairs(R"(class="pairs">([0-9.]+)<)");
  std::smatch mt, mp;
  ASSERT_TRUE(std::regex_search(dom, mt, tokens)) << dom;
  EXPECT_GT(std::stod(mt[1]), 0) << "tokens/s of backbone-1";
  ASSERT_TRUE(std::regex_search(dom, mp, pairs)) << dom;
  EXPECT_GT(std::stod(mp[1]), 0) << "pairs/s of phone-1";
}

TEST_F(CoordinatorProcess, CutsThePlanServesSlicesAndTheDashboard) {
  const std::string slices = (dir_ / "slices").string();
  std::vector<std::string> argv = args(slices, (dir_ / "dash.sqlite").string());
  argv[argv.size() - 3] = "1";  // --heartbeat-s 1: a node silent for 3 s is stale
  CoordProcess c(argv);
  ASSERT_NE(c.port(), 0) << "the coordinator did not start";
  auto manifest = SliceManifest::load(slices + "/manifest.json");
  ASSERT_TRUE(manifest) << manifest.status().message();
  Reply reg = request(c.port(), "POST", "/api/nodes", R"({"name": "phone-1"})", kAdmin);
  ASSERT_EQ(reg.status, 201);
  const std::string token = reg.j()["token"];
  const json model = request(c.port(), "GET", "/api/model", "", token).j();
  ASSERT_EQ(model["slices"].size(), manifest->slices.size());
  const json first = model["slices"][0];
  Reply dl = request(c.port(), "GET", first["url"].get<std::string>(), "", token);
  ASSERT_EQ(dl.status, 200);
  EXPECT_EQ(digest_hex(sha256({reinterpret_cast<const uint8_t*>(dl.body.data()), dl.body.size()})), first["sha256"]);
  EXPECT_EQ(dl.headers["X-Essaim-Sha256"], first["sha256"]);

  // Three nodes heartbeating with a slice each (the first still registered as phone-1); server-3 then goes
  // silent, and is stale by the time the page is read. A backbone reports usage and work.
  std::vector<std::pair<std::string, std::string>> nodes = {{reg.j()["node_id"], token}};
  for (const char* name : {"laptop-2", "server-3"}) {
    Reply r = request(c.port(), "POST", "/api/nodes", json{{"name", name}}.dump(), kAdmin);
    ASSERT_EQ(r.status, 201);
    nodes.emplace_back(r.j()["node_id"], r.j()["token"]);
  }
  const auto beat = [&](size_t i) {
    const json s = model["slices"][i];
    json h = json::array({{{"layer", s["layer"]}, {"expert_first", s["expert_first"]}, {"expert_count", s["expert_count"]},
                           {"sha256", s["sha256"]}}});
    return request(c.port(), "POST", "/api/expert-coverage", heartbeat_body(nodes[i].first, model, h, 9000 + int(i)).dump(),
                   nodes[i].second);
  };
  for (size_t i = 0; i < nodes.size(); ++i) {
    Reply hb = beat(i);
    ASSERT_EQ(hb.status, 200) << hb.body;
    EXPECT_EQ(hb.j()["fingerprint_ok"], true) << hb.body;
  }
  EXPECT_EQ(request(c.port(), "GET", "/api/expert-map", "", token).j()["workers"].size(), 3u);
  backbone_reports(c.port(), model);
  std::atomic<bool> beating{true};
  std::thread live([&] {  // phone-1 and laptop-2 stay fresh while Chromium runs
    while (beating) {
      beat(0);
      beat(1);
      std::this_thread::sleep_for(300ms);
    }
  });
  std::this_thread::sleep_for(3500ms);
  struct Stop {
    std::atomic<bool>& b;
    std::thread& t;
    ~Stop() { b = false; t.join(); }
  } stop{beating, live};

  if (std::system("command -v chromium >/dev/null 2>&1") != 0)
    ESSAIM_SKIP_MISSING_DEP(essaim::test_support::Dep::CHROMIUM, "no chromium on PATH");
  const std::string url = "http://127.0.0.1:" + std::to_string(c.port()) + "/";
  const std::string dom = chromium_dom(dir_, url);
  ASSERT_FALSE(dom.empty());
  check_public_dom(dom);
  // With the admin token in the URL's fragment (never sent to a server), the addresses too.
  const std::string admin_dom = chromium_dom(dir_, url + "#admin=" + kAdmin);
  EXPECT_NE(admin_dom.find("127.0.0.1:9000"), std::string::npos) << admin_dom;

  const std::string shot = std::string(ESSAIM_BINARY_DIR) + "/coord_dashboard.png";
  fs::remove(shot);
  const std::string flags = "--headless --no-sandbox --disable-gpu --no-first-run --user-data-dir=" + (dir_ / "chrome").string() +
                            " --virtual-time-budget=5000 ";
  const std::string screenshot = "timeout 90 chromium " + flags + "--window-size=1200,1000 --screenshot=" + shot + " '" +
                                 url + "#admin=" + kAdmin + "' >/dev/null 2>&1";
  ASSERT_EQ(std::system(screenshot.c_str()), 0) << screenshot;
  EXPECT_GT(fs::file_size(shot), 1000u);
  std::printf("dashboard screenshot: %s\n", shot.c_str());
}

std::string CoordinatorProcess_heartbeat(const std::string& id, const json& model, int i) {
  return json{{"node_id", id}, {"address", "127.0.0.1:7000"},
              {"fingerprint", {{"model_identity", model["model_identity"]}, {"protocol_version", model["protocol_version"]},
                               {"kernel_abi", model["kernel_abi"]}}},
              {"holdings", json::array()}, {"capacity_bytes", i}, {"load", 0.5}}.dump();
}

// Writes go on from a client thread while the coordinator is killed; every write answered 200 before the
// kill must be there after the restart (at most the one in flight may have committed without an answer).
void kill_nine_round(const std::vector<std::string>& argv) {
  auto c = std::make_unique<CoordProcess>(argv);
  ASSERT_NE(c->port(), 0) << "the coordinator did not start";
  Reply reg = request(c->port(), "POST", "/api/nodes", R"({"name": "busy"})", kAdmin);
  ASSERT_EQ(reg.status, 201);
  const std::string id = reg.j()["node_id"], token = reg.j()["token"];
  const json model = request(c->port(), "GET", "/api/model", "", token).j();
  std::atomic<int64_t> acked_work{0}, acked_beats{0};
  std::atomic<bool> stop{false};
  const uint16_t port = c->port();
  std::thread writer([&] {
    for (int i = 0; !stop && i < 100000; ++i) {
      if (i % 2 == 0) {
        Reply r = request(port, "POST", "/api/expert-coverage", CoordinatorProcess_heartbeat(id, model, i), token);
        if (r.status == 200) acked_beats = i;
        else if (r.status == 0) break;
      } else {
        Reply r = request(port, "POST", "/api/work",
                          json{{"reports", {{{"address", "127.0.0.1:7000"}, {"pairs_accepted", 1}, {"audits", 0},
                                             {"audits_failed", 0}}}}}.dump(), kAdmin);
        if (r.status == 200) ++acked_work;
        else if (r.status == 0) break;
      }
    }
  });
  std::mt19937 rng(11);
  std::this_thread::sleep_for(std::chrono::milliseconds(300 + rng() % 400));
  c->kill_hard();
  stop = true;
  writer.join();
  ASSERT_GT(acked_work.load(), 0) << "no write was acknowledged before the kill";
  c = std::make_unique<CoordProcess>(argv);
  ASSERT_NE(c->port(), 0) << "the coordinator did not restart";
  EXPECT_EQ(request(c->port(), "GET", "/api/whoami", "", token).status, 200);  // the node's identity survived
  const json rewards = request(c->port(), "GET", "/api/rewards", "", token).j();
  ASSERT_EQ(rewards["nodes"].size(), 1u) << rewards.dump();
  const int64_t credited = rewards["nodes"][0]["pairs_credited"];
  EXPECT_GE(credited, acked_work.load());
  EXPECT_LE(credited, acked_work.load() + 1);
  std::printf("%lld work reports and %lld heartbeats acknowledged before SIGKILL; %lld pairs credited after restart\n",
              (long long)acked_work.load(), (long long)acked_beats.load() / 2, (long long)credited);
}

TEST_F(CoordinatorProcess, KillNineLosesNoAcknowledgedWriteSqlite) {
  const std::string slices = (dir_ / "slices-kill").string();
  kill_nine_round(args(slices, (dir_ / "kill.sqlite").string()));
}

TEST_F(CoordinatorProcess, KillNineLosesNoAcknowledgedWritePostgres) {
  testing::PgCluster pg;
  if (!pg.ok()) ESSAIM_SKIP_MISSING_DEP(essaim::test_support::Dep::POSTGRESQL, pg.why());
  const std::string slices = (dir_ / "slices-kill-pg").string();
  kill_nine_round(args(slices, pg.fresh_url()));
}

}  // namespace
}  // namespace essaim::coord
