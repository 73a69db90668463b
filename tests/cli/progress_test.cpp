// Progress is drawn on a terminal and never into a pipe: the module on its own (a pipe it is told to draw
// on, one it is not), and the binaries under a pseudo-terminal (forkpty) against the same commands with
// stderr captured into a file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <thread>

#include "cli_test_util.h"
#include "core/progress.h"
#include "model_fixture.h"

namespace essaim::cli_test {
namespace {

std::string read_pipe(int fd) {
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) out.append(buf, size_t(n));
  return out;
}

TEST(Progress, LineShowsBytesRateAndTimeLeft) {
  EXPECT_EQ(progress_bytes_text(17), "17 B");
  EXPECT_EQ(progress_bytes_text(1536), "1.50 KiB");
  EXPECT_EQ(progress_bytes_text(3.0 * (1 << 30)), "3.00 GiB");
  EXPECT_EQ(progress_duration_text(65), "1:05");
  EXPECT_EQ(progress_duration_text(3725), "1:02:05");
  const std::string line = progress_line("slice", 1 << 30, 4ull << 30, 2.0, false);
  EXPECT_EQ(line, "slice  1.00 GiB / 4.00 GiB   25%  512.00 MiB/s  0:06 left");
  EXPECT_EQ(progress_line("get", 1 << 20, 0, 1.0, true), "get  1.00 MiB  1.00 MiB/s  in 0:01");  // total unknown
}

TEST(Progress, DrawsOnlyWhereItShould) {
  for (const bool force : {true, false}) {
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    {
      Progress p("job", 1000, {.fd = fds[1], .enabled = force ? std::optional<bool>(true) : std::nullopt,
                               .interval = std::chrono::milliseconds(0)});
      EXPECT_EQ(p.enabled(), force);  // a pipe is no terminal
      std::vector<std::thread> threads;
      for (int t = 0; t < 4; ++t)
        threads.emplace_back([&p] {
          for (int i = 0; i < 25; ++i) p.advance(10);
        });
      for (std::thread& t : threads) t.join();
      EXPECT_EQ(p.done(), 1000u);
    }
    ::close(fds[1]);
    const std::string out = read_pipe(fds[0]);
    ::close(fds[0]);
    if (!force) {
      EXPECT_TRUE(out.empty()) << out;
      continue;
    }
    EXPECT_NE(out.find("\rjob  "), std::string::npos) << out;
    EXPECT_NE(out.find("100%"), std::string::npos) << out;
    EXPECT_EQ(count_of(out, "\n"), 1u) << "one final newline: " << out;
    EXPECT_EQ(out.back(), '\n');
  }
}

TEST(Progress, NothingAdvancedNothingDrawn) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  { Progress p("idle", 10, {.fd = fds[1], .enabled = true}); }
  ::close(fds[1]);
  EXPECT_EQ(read_pipe(fds[0]), "");
  ::close(fds[0]);
}

// The command, once under a terminal and once with stdout and stderr in files.
void expect_progress_on_terminal_only(const std::string& command, const std::string& label) {
  SCOPED_TRACE(command);
  const CliRun tty = run_in_pty(command);
  EXPECT_EQ(tty.code, 0) << tty.out;
  EXPECT_NE(tty.out.find("\r" + label), std::string::npos) << tty.out;
  EXPECT_NE(tty.out.find("100%"), std::string::npos) << tty.out;
  EXPECT_NE(tty.out.find("/s"), std::string::npos) << tty.out;
  const CliRun piped = run_cli(command);
  EXPECT_EQ(piped.code, 0) << piped.err;
  EXPECT_EQ(piped.err.find('\r'), std::string::npos) << piped.err;
  EXPECT_EQ(piped.out.find('\r'), std::string::npos) << piped.out;
  EXPECT_EQ(piped.err.find(label), std::string::npos) << piped.err;
}

TEST(Progress, SliceAndSynthShowItOnATerminalOnly) {
  const std::string dir = make_temp_dir("progress");
  expect_progress_on_terminal_only("essaim slice -m " + tiny_model() + " --plan 2 -o " + dir + "/plan", "slice ");
  expect_progress_on_terminal_only("essaim slice -m " + tiny_model() + " --backbone -o " + dir + "/bb.gguf", "slice ");
  expect_progress_on_terminal_only(
      "essaim synth --arch qwen3moe --preset tiny --types f32 -o " + dir + "/s.gguf", "synth ");
  expect_progress_on_terminal_only("essaim slice --verify " + dir + "/plan/manifest.json", "verify ");
}

TEST(Progress, MlockReadsTheModelWithProgress) {
  const std::string command = "essaim eval -m " + tiny_model() + " --tokens 1,2 --mlock --logits-out " +
                              make_temp_dir("mlock") + "/l.npy";
  const CliRun tty = run_in_pty(command);
  // mlock itself may be refused (RLIMIT_MEMLOCK); the reading before it is what shows progress.
  EXPECT_TRUE(tty.code == 0 || tty.out.find("mlock") != std::string::npos) << tty.out;
  EXPECT_NE(tty.out.find("\rreading " + tiny_model()), std::string::npos) << tty.out;
  const CliRun piped = run_cli(command);
  EXPECT_EQ(piped.err.find('\r'), std::string::npos) << piped.err;
  EXPECT_EQ(piped.err.find("reading "), std::string::npos) << piped.err;
}

}  // namespace
}  // namespace essaim::cli_test
