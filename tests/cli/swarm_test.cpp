// The swarm from the command line: `worker --slices DIR --experts A-B [--layers A-B]` serves exactly the
// manifest's slices inside the ranges; a worker that never connects and the layers no worker covers are
// reported once at the start of a run, and --require-workers makes them an error; the expert map's label
// names the worker in the dispatch summary.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "model_fixture.h"

namespace essaim::cli_test {
namespace {

std::string addr(const BackgroundProcess& w) { return "127.0.0.1:" + std::to_string(w.port()); }

TEST(WorkerSlices, PicksTheMatchingSlicesOfTheManifest) {
  const std::string dir = tiny_slices_dir();
  {
    BackgroundProcess w("essaim worker --slices " + dir + " --experts 3-5 --port 0");
    ASSERT_NE(w.port(), 0) << w.stderr_text();
    EXPECT_NE(w.stderr_text().find("2 slice(s)"), std::string::npos) << w.stderr_text();
    EXPECT_NE(w.stderr_text().find("layer 0 experts 3-5, layer 1 experts 3-5"), std::string::npos) << w.stderr_text();
  }
  {
    BackgroundProcess w("essaim-worker --slices " + dir + " --experts 0-5 --layers 1 --port 0");
    ASSERT_NE(w.port(), 0) << w.stderr_text();
    EXPECT_NE(w.stderr_text().find("layer 1 experts 0-2, layer 1 experts 3-5"), std::string::npos) << w.stderr_text();
    EXPECT_EQ(w.stderr_text().find("layer 0"), std::string::npos) << w.stderr_text();
  }
  CliRun r = run_cli("essaim worker --slices " + dir + " --experts 1-4 --port 0");  // straddles E0-2 and E3-5
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("lies only partly inside"), std::string::npos) << r.err;
  r = run_cli("essaim worker --slices " + dir + " --experts 6-9 --port 0");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("no slice of"), std::string::npos) << r.err;
  r = run_cli("essaim worker --slices " + dir + " --port 0");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--slices needs --experts"), std::string::npos) << r.err;
}

// The runs with ranges no worker serves use the full model (-m) on purpose: they test the report and the local
// copy computing what is missing. The covered run uses the backbone file, so a hole there fails it.
TEST(Coverage, AMissingWorkerAndUncoveredLayersAreReportedOnceAndRequireWorkersFails) {
  const std::string dir = tiny_slices_dir();
  BackgroundProcess low("essaim worker --slices " + dir + " --experts 0-2 --port 0 -q");
  ASSERT_NE(low.port(), 0) << low.stderr_text();
  // Port 1 on loopback: nothing listens there (connection refused at once).
  const std::string base = "essaim run -m " + tiny_model() + " -p Hello -n 6 --temp 0 --worker-timeout-ms 5000 ";
  CliRun r = run_cli(base + "--worker " + addr(low) + " --worker 127.0.0.1:1");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(count_of(r.err, "worker 127.0.0.1:1 did not connect"), 1u) << r.err;
  EXPECT_EQ(count_of(r.err, "layers 0-1: experts 3-5 are on no connected worker"), 1u) << r.err;

  r = run_cli(base + "--worker " + addr(low) + " --worker 127.0.0.1:1 --require-workers");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("--require-workers"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty()) << "nothing generated: " << r.out;

  // The whole model covered: no report, and --require-workers is satisfied.
  BackgroundProcess high("essaim worker --slices " + dir + " --experts 3-5 --port 0 -q");
  ASSERT_NE(high.port(), 0) << high.stderr_text();
  r = run_cli("essaim run --backbone-file " + tiny_backbone() + " -p Hello -n 6 --temp 0 --worker-timeout-ms 5000 " +
              "--worker " + addr(low) + " --worker " + addr(high) + " --require-workers");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err.find("no connected worker"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("did not connect"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("2 of 2 workers connected"), std::string::npos) << r.err;
  const CliRun mono = run_cli("essaim run -m " + tiny_model() + " -p Hello -n 6 --temp 0");
  EXPECT_EQ(r.out, mono.out) << "the sharded run must write the monolithic text";

  // A layer no worker covers at all.
  BackgroundProcess l1("essaim worker --slices " + dir + " --experts 0-5 --layers 1 --port 0 -q");
  ASSERT_NE(l1.port(), 0) << l1.stderr_text();
  r = run_cli(base + "--worker " + addr(l1));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(count_of(r.err, "layer 0: no connected worker serves any expert"), 1u) << r.err;

  EXPECT_EQ(run_cli(base + "--require-workers").code, 1) << "--require-workers without workers";
}

TEST(Coverage, TheMapLabelNamesTheWorkerInTheSummary) {
  BackgroundProcess w("essaim worker --slices " + tiny_slices_dir() + " --experts 0-5 --layers 0-1 --port 0 -q");
  ASSERT_NE(w.port(), 0) << w.stderr_text();
  const std::string map = make_temp_dir("map") + "/map.json";
  std::ofstream(map) << nlohmann::json{{"workers", {{{"address", addr(w)}, {"label", "the-laptop"}}}}}.dump();
  const CliRun r = run_cli("essaim run -m " + tiny_model() + " -p Hi -n 2 --expert-map " + map);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("worker " + addr(w) + " (the-laptop): up"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace essaim::cli_test
