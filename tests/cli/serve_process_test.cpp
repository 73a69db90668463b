// `essaim serve` as a process that never lies (issue 45, part 7): a taken port is one clear line and exit 1;
// /health says 503 with the reason while some expert has no live holder and no local copy, and 200 again
// once a worker serves it; SIGTERM mid-stream ends the stream with an error event (never a silent close that
// a client could take for a finished answer); llama-server flags that mean nothing here start the server
// with a note; one access-log line per request, without prompt text.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "cli_test_util.h"
#include "model_fixture.h"

namespace essaim::cli_test {
namespace {

using namespace std::chrono_literals;

std::string base(uint16_t port) { return "http://127.0.0.1:" + std::to_string(port); }

TEST(ServeProcess, ATakenPortIsOneClearLineAndExitOne) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof a;
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const std::string port = std::to_string(ntohs(a.sin_port));
  const CliRun r = run_cli("essaim serve -m " + tiny_model() + " --host 127.0.0.1 --port " + port, "", 60);
  ::close(fd);
  EXPECT_EQ(r.code, 1) << r.err;  // not 139 (the segfault this replaced)
  EXPECT_EQ(count_of(r.err, "\n"), 1u) << r.err;
  EXPECT_NE(r.err.find("essaim serve: cannot listen on 127.0.0.1:" + port), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("in use"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
}

TEST(ServeProcess, HealthIs503WithTheReasonWhileAnExpertHasNoLiveHolderAnd200WhenOneReturns) {
  const std::string slices = tiny_slices_dir();
  auto worker = std::make_unique<BackgroundProcess>("essaim-worker --slices " + slices + " --experts 0-5 --port 0 -q");
  ASSERT_NE(worker->port(), 0) << worker->stderr_text();
  const std::string worker_port = std::to_string(worker->port());
  BackgroundProcess serve("essaim serve --backbone-file " + tiny_backbone() + " --port 0 -np 1 -t 1 --worker-timeout-ms 1000 --worker 127.0.0.1:" + worker_port);
  ASSERT_NE(serve.port(), 0) << serve.stderr_text();
  ASSERT_TRUE(wait_for_health(serve.port(), 200, 60s)) << serve.stderr_text();

  worker.reset();  // SIGTERM: the only holder of every expert is gone, and the backbone has no copy
  ASSERT_TRUE(wait_for_health(serve.port(), 503, 30s)) << serve.stderr_text();
  const auto [status, body] = health(serve.port());
  EXPECT_EQ(status, 503);
  EXPECT_NE(body.find("swarm_unavailable"), std::string::npos) << body;
  EXPECT_NE(body.find("layers 0-1: no connected worker serves any expert"), std::string::npos) << body;

  // The worker back on its port: the link reconnects and /health says 200 again; a request is answered.
  BackgroundProcess back("essaim-worker --slices " + slices + " --experts 0-5 --port " + worker_port + " -q");
  ASSERT_NE(back.port(), 0) << back.stderr_text();
  EXPECT_TRUE(wait_for_health(serve.port(), 200, 60s)) << serve.stderr_text();
  const CliRun c = run_cli("curl -s -m 60 -w '\\n%{http_code}' -d '{\"prompt\":\"Once upon\",\"max_tokens\":4}' " +
                           base(serve.port()) + "/v1/completions");
  EXPECT_NE(c.out.find("\n200"), std::string::npos) << c.out;
}

TEST(ServeProcess, SigtermMidStreamEndsTheStreamWithAnErrorEventAndLogsOneLinePerRequest) {
  BackgroundProcess serve("essaim serve -m " + tiny_model() + " --port 0 -np 2 -t 1 -c 8192 -ngl 99 --flash-attn on --mlock");
  ASSERT_NE(serve.port(), 0) << serve.stderr_text();
  ASSERT_TRUE(wait_for_health(serve.port(), 200, 60s)) << serve.stderr_text();
  const std::string err0 = serve.stderr_text();
  EXPECT_NE(err0.find("note: --n-gpu-layers 99 is ignored"), std::string::npos) << err0;
  EXPECT_NE(err0.find("note: --flash-attn on is ignored"), std::string::npos) << err0;
  EXPECT_NE(err0.find("note: --mlock"), std::string::npos) << err0;

  // A long stream (8000 tokens); once its first tokens arrived, SIGTERM.
  const std::string dir = make_temp_dir("serve-stop");
  const std::string out = dir + "/stream.txt";
  const std::string secret = "Once upon a secret prompt";
  const CliRun started = run_cli("curl -sN -m 120 -d '{\"prompt\":\"" + secret +
                                 "\",\"max_tokens\":8000,\"stream\":true}' " + base(serve.port()) +
                                 "/v1/completions > " + out + " 2>&1 < /dev/null &");
  ASSERT_EQ(started.code, 0) << started.err;
  const auto end = std::chrono::steady_clock::now() + 60s;
  while (count_of(read_text(out), "data: ") < 3 && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(20ms);
  ASSERT_GE(count_of(read_text(out), "data: "), 3u) << read_text(out);
  ASSERT_EQ(::kill(serve.pid(), SIGTERM), 0);
  const auto stop_end = std::chrono::steady_clock::now() + 30s;
  while (read_text(out).find("server_shutting_down") == std::string::npos && std::chrono::steady_clock::now() < stop_end)
    std::this_thread::sleep_for(20ms);
  const std::string stream = read_text(out);
  const size_t error_event = stream.find("data: {\"error\":{");
  ASSERT_NE(error_event, std::string::npos) << stream;
  EXPECT_NE(stream.find("\"code\":\"server_shutting_down\"", error_event), std::string::npos) << stream;
  EXPECT_EQ(stream.find("[DONE]"), std::string::npos) << "a cut stream must not look finished";
  EXPECT_EQ(stream.find("\"finish_reason\":\"length\""), std::string::npos) << stream;

  const std::string err = serve.stderr_text();
  EXPECT_NE(err.find("GET /health 200"), std::string::npos) << err;
  EXPECT_NE(err.find("POST /v1/completions 200 prompt="), std::string::npos) << err;
  EXPECT_NE(err.find("(server_shutting_down)"), std::string::npos) << err;
  EXPECT_EQ(err.find("secret"), std::string::npos) << "the access log never carries prompt text";
}

}  // namespace
}  // namespace essaim::cli_test
