// `essaim --version` and `essaim version --json` tell the same fingerprint the worker handshake carries:
// a real `essaim worker` process is asked for its HELLO over TCP and its kernel ABI, ISA class and
// protocol version are compared with what the version command printed.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "model_fixture.h"
#include "net/frame_connection.h"
#include "net/tcp.h"

namespace essaim::cli_test {
namespace {

using namespace std::chrono_literals;

TEST(Version, JsonHoldsTheFieldsDocsCliMdLists) {
  const CliRun r = run_cli("essaim version --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  for (const char* key : {"version", "git_commit", "build_type", "isa"}) {
    ASSERT_TRUE(j.contains(key) && j[key].is_string()) << key << " in " << r.out;
    EXPECT_FALSE(j[key].get<std::string>().empty()) << key;
  }
  ASSERT_TRUE(j["kernel_abi"].is_number_unsigned()) << r.out;
  ASSERT_TRUE(j["protocol_version"].is_number_unsigned()) << r.out;
  // Both spellings print the same facts.
  const CliRun flag = run_cli("essaim --version");
  ASSERT_EQ(flag.code, 0);
  EXPECT_NE(flag.out.find("essaim " + j["version"].get<std::string>() + " (commit " + j["git_commit"].get<std::string>()),
            std::string::npos) << flag.out;
  EXPECT_NE(flag.out.find("ABI " + std::to_string(j["kernel_abi"].get<uint32_t>()) + ", ISA " + j["isa"].get<std::string>()),
            std::string::npos) << flag.out;
  EXPECT_EQ(run_cli("essaim-worker --version").out, flag.out);
}

TEST(Version, MatchesTheFingerprintAWorkerAnnouncesAtTheHandshake) {
  const CliRun r = run_cli("essaim version --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json v = nlohmann::json::parse(r.out);

  BackgroundProcess w("essaim worker --slices " + tiny_slices_dir() + " --experts 0-2 --port 0 -q");
  ASSERT_NE(w.port(), 0) << w.stderr_text();
  net::NetResult<std::unique_ptr<net::TcpStream>> s = net::tcp_connect("127.0.0.1", w.port(), net::deadline_in(10s));
  ASSERT_TRUE(s) << s.error().message;
  net::FrameConnection c(std::move(*s));
  // The worker sends its HELLO first, before reading ours (the handshake is symmetric).
  net::NetResult<proto::Message> m = c.receive(net::deadline_in(10s));
  ASSERT_TRUE(m) << m.error().message;
  const proto::Hello* hello = std::get_if<proto::Hello>(&*m);
  ASSERT_NE(hello, nullptr);
  EXPECT_EQ(v["kernel_abi"].get<uint32_t>(), hello->fingerprint.kernel_abi);
  EXPECT_EQ(v["isa"].get<std::string>(), hello->fingerprint.isa_class);
  EXPECT_EQ(v["protocol_version"].get<uint16_t>(), hello->version);
}

}  // namespace
}  // namespace essaim::cli_test
