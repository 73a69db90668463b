// The same store suite against SQLite and a real PostgreSQL server (started by the test, pg_cluster.h):
// rows round-trip, transactions join, work and drops, invalid rows are skipped, schema versions are checked,
// and a process killed with SIGKILL in the middle of heartbeats and work reports loses no committed row.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <random>
#include <set>
#include <thread>

#include "coord/sql_connection.h"
#include "coord/store.h"
#include "pg_cluster.h"
#include "skip.h"
#include "temp_dir.h"

namespace essaim::coord {
namespace {

testing::PgCluster& cluster() {
  static auto* c = new testing::PgCluster();  // stopped by the atexit below
  static const int registered = std::atexit([] { delete c; });
  (void)registered;
  return *c;
}

std::string hex64(char c) { return std::string(64, c); }
std::string node_id(int i) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "n-%016x", i);
  return buf;
}

class StoreTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "postgresql") {
      if (!cluster().ok()) ESSAIM_SKIP_MISSING_DEP(essaim::test_support::Dep::POSTGRESQL, cluster().why());
      spec_ = cluster().fresh_url();
    } else {
      dir_ = essaim::testing::make_temp_dir(std::string("essaim-store-") +
                                            ::testing::UnitTest::GetInstance()->current_test_info()->name());
      spec_ = (dir_ / "coord.sqlite").string();
    }
    auto s = open_store(spec_);
    ASSERT_TRUE(s) << s.status().message();
    store_ = std::move(*s);
  }
  void TearDown() override {
    store_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  NodeRow node(int i) {
    return {.node_id = node_id(i), .name = "node-" + std::to_string(i), .token_sha256 = hex64("0123456789abcdef"[i % 16]),
            .registered_ms = 1000 + i};
  }
  std::filesystem::path dir_;
  std::string spec_;
  std::unique_ptr<Store> store_;
};

TEST_P(StoreTest, NodesRoundTripInRegistrationOrder) {
  for (int i : {3, 1, 2}) ASSERT_TRUE(store_->add_node(node(i)));
  auto nodes = store_->list_nodes();
  ASSERT_TRUE(nodes) << nodes.status().message();
  ASSERT_EQ(nodes->size(), 3u);
  EXPECT_EQ((*nodes)[0].node_id, node_id(1));
  EXPECT_EQ((*nodes)[2].node_id, node_id(3));
  auto by_token = store_->node_by_token_sha256(hex64('2'));
  ASSERT_TRUE(by_token && *by_token);
  EXPECT_EQ((*by_token)->name, "node-2");
  EXPECT_FALSE(store_->node_by_token_sha256(hex64('9'))->has_value());
  EXPECT_FALSE(store_->add_node(node(1)));  // same id twice: refused, not overwritten
  auto revoked = store_->revoke_node(node_id(2));
  ASSERT_TRUE(revoked);
  EXPECT_TRUE(*revoked);
  EXPECT_FALSE(*store_->revoke_node(node_id(9)));
  EXPECT_TRUE((**store_->node_by_token_sha256(hex64('2'))).revoked);
}

TEST_P(StoreTest, HeartbeatReplacesHoldings) {
  ASSERT_TRUE(store_->add_node(node(1)));
  NodeRow f = node(1);
  f.address = "127.0.0.1:9000";
  f.model_identity = hex64('a');
  f.protocol_version = 2;
  f.kernel_abi = "1";
  f.fingerprint_ok = true;
  f.last_heartbeat_ms = 123456789;
  f.capacity_bytes = int64_t(1) << 40;
  f.load = 0.25;
  ASSERT_TRUE(store_->heartbeat(f, {{f.node_id, 3, 0, 32, hex64('b')}, {f.node_id, 4, 32, 32, hex64('c')}}));
  ASSERT_TRUE(store_->heartbeat(f, {{f.node_id, 5, 0, 16, hex64('d')}}));
  auto h = store_->list_holdings();
  ASSERT_TRUE(h);
  ASSERT_EQ(h->size(), 1u);
  EXPECT_EQ((*h)[0].layer, 5);
  EXPECT_EQ((*h)[0].expert_count, 16);
  const NodeRow back = (*store_->list_nodes())[0];
  EXPECT_EQ(back.address, f.address);
  EXPECT_EQ(back.last_heartbeat_ms, f.last_heartbeat_ms);
  EXPECT_EQ(back.capacity_bytes, f.capacity_bytes);
  EXPECT_DOUBLE_EQ(back.load, 0.25);
  EXPECT_TRUE(back.fingerprint_ok);
  ASSERT_TRUE(*store_->revoke_node(f.node_id));
  EXPECT_TRUE(store_->list_holdings()->empty());
}

TEST_P(StoreTest, UsageAccumulatesAndPendingExpires) {
  ASSERT_TRUE(store_->add_usage(3, {1, 0, 5}));
  ASSERT_TRUE(store_->add_usage(3, {2, 0, 0}));
  auto u = store_->list_usage();
  ASSERT_TRUE(u);
  ASSERT_EQ(u->size(), 2u);
  EXPECT_EQ((*u)[0].count, 3);
  EXPECT_EQ((*u)[1].count, 5);
  ASSERT_TRUE(store_->set_pending(node_id(1), {{node_id(1), 3, 0, 2000}, {node_id(1), 3, 32, 2000}}, 1000));
  ASSERT_TRUE(store_->set_pending(node_id(2), {{node_id(2), 4, 0, 5000}}, 1500));
  EXPECT_EQ(store_->list_pending(1999)->size(), 3u);
  EXPECT_EQ(store_->list_pending(2000)->size(), 1u);  // expired at until_ms
  ASSERT_TRUE(store_->set_pending(node_id(1), {}, 1500));
  EXPECT_EQ(store_->list_pending(1000)->size(), 1u);
}

TEST_P(StoreTest, ASwapsGiveUpIsPendingBesideItsTake) {
  ASSERT_TRUE(store_->set_pending(node_id(1), {{node_id(1), 3, 0, 2000, false}, {node_id(1), 2, 32, 2000, true}}, 1000));
  auto p = store_->list_pending(1500);
  ASSERT_TRUE(p);
  ASSERT_EQ(p->size(), 2u);
  EXPECT_FALSE((*p)[0].give_up);
  EXPECT_EQ((*p)[0].layer, 3);
  EXPECT_TRUE((*p)[1].give_up);
  EXPECT_EQ((*p)[1].expert_first, 32);
  ASSERT_TRUE(store_->set_pending(node_id(1), {}, 1500));  // replaced, give-up included
  EXPECT_TRUE(store_->list_pending(1500)->empty());
}

TEST_P(StoreTest, UsageDecaysWithItsHalfLife) {
  constexpr int64_t kHalfLife = 3200'000;
  ASSERT_TRUE(store_->decay_usage(1'000'000, kHalfLife));  // the first call records the time only
  ASSERT_TRUE(store_->add_usage(0, {1000, 3, 0, 1}));
  ASSERT_TRUE(store_->decay_usage(1'000'000 + kHalfLife / 64, kHalfLife));  // too soon: nothing
  EXPECT_EQ(store_->list_usage()->at(0).count, 1000);
  ASSERT_TRUE(store_->decay_usage(1'000'000 + kHalfLife, kHalfLife));
  auto u = store_->list_usage();
  ASSERT_TRUE(u);
  ASSERT_EQ(u->size(), 3u);
  EXPECT_EQ((*u)[0].count, 500);
  EXPECT_EQ((*u)[1].count, 2);  // 1.5 rounds away from zero, on both backends
  EXPECT_EQ((*u)[2].count, 1);  // 0.5 too
  ASSERT_TRUE(store_->decay_usage(1'000'000 + 3 * kHalfLife, kHalfLife));
  u = store_->list_usage();
  ASSERT_EQ(u->size(), 2u);
  EXPECT_EQ((*u)[0].count, 125);
  EXPECT_EQ((*u)[1].count, 1);  // 0.5; expert 3's 0.25 is gone
  ASSERT_TRUE(store_->decay_usage(1'000'000 + 5 * kHalfLife, kHalfLife));
  EXPECT_EQ(store_->list_usage()->size(), 1u) << "a count that reaches 0 is forgotten";
}

TEST_P(StoreTest, FailedAuditDropsAndWithholds) {
  ASSERT_TRUE(store_->add_node(node(1)));
  ASSERT_TRUE(store_->add_work(node_id(1), {100, 10, 0}, ""));
  ASSERT_TRUE(store_->add_work(node_id(1), {50, 5, 0}, ""));
  auto w = store_->list_work();
  ASSERT_TRUE(w);
  ASSERT_EQ(w->size(), 1u);
  EXPECT_EQ((*w)[0].pairs_credited, 150);
  EXPECT_EQ((*w)[0].audits, 15);
  ASSERT_TRUE(store_->add_work(node_id(1), {7, 3, 1}, "failed 1 of 3 audits"));
  ASSERT_TRUE(store_->add_work(node_id(1), {3, 0, 0}, ""));  // after the drop: withheld too
  w = store_->list_work();
  EXPECT_EQ((*w)[0].pairs_credited, 0);
  EXPECT_EQ((*w)[0].withheld, 160);
  EXPECT_EQ((*w)[0].audits_failed, 1);
  const NodeRow n = (*store_->list_nodes())[0];
  EXPECT_EQ(n.status, "dropped");
  EXPECT_EQ(n.reason, "failed 1 of 3 audits");
}

TEST_P(StoreTest, ExclusiveRollsBackOnError) {
  Status st = store_->exclusive([&]() -> Status {
    ESSAIM_RETURN_IF_ERROR(store_->add_node(node(1)));
    return Status::error("changed my mind");
  });
  EXPECT_FALSE(st);
  EXPECT_TRUE(store_->list_nodes()->empty());
  EXPECT_TRUE(store_->exclusive([&] { return store_->add_node(node(2)); }));
  EXPECT_EQ(store_->list_nodes()->size(), 1u);
}

// The market generation moves in the transaction of every write that can change a decision, and not for
// one that cannot (a renewal of the same reservations, usage of nothing, revoking no node).
TEST_P(StoreTest, TheMarketGenerationMovesWithWhatDecisionsRead) {
  const auto generation = [&] { return store_->market_generation().value().value(); };
  EXPECT_EQ(generation(), 0);
  ASSERT_TRUE(store_->add_node(node(1)));
  EXPECT_EQ(generation(), 0);  // a node with nothing held or reserved is in no decision
  const PendingRow take{node_id(1), 3, 0, 5000, false};
  ASSERT_TRUE(store_->set_pending(node_id(1), {take}, 1000));
  EXPECT_EQ(generation(), 1);
  PendingRow later = take;
  later.until_ms = 6000;
  ASSERT_TRUE(store_->set_pending(node_id(1), {later}, 2000));  // renewed, expiring later: no change
  EXPECT_EQ(generation(), 1);
  ASSERT_TRUE(store_->set_pending(node_id(1), {take}, 2000));  // expiring sooner: a reader must reread
  EXPECT_EQ(generation(), 2);
  ASSERT_TRUE(store_->set_pending(node_id(1), {}, 2000));
  EXPECT_EQ(generation(), 3);
  ASSERT_TRUE(store_->set_pending(node_id(1), {}, 2000));
  EXPECT_EQ(generation(), 3);
  ASSERT_TRUE(store_->add_usage(2, {0, 0, 0}));
  EXPECT_EQ(generation(), 3);
  ASSERT_TRUE(store_->add_usage(2, {0, 4, 0}));
  EXPECT_EQ(generation(), 4);
  ASSERT_TRUE(store_->add_work(node_id(1), {.pairs = 5}, ""));
  EXPECT_EQ(generation(), 4);
  ASSERT_TRUE(store_->add_work(node_id(1), {.pairs = 1, .audits = 1, .audits_failed = 1}, "failed"));  // dropped
  EXPECT_EQ(generation(), 5);
  EXPECT_FALSE(*store_->revoke_node(node_id(9)));
  EXPECT_EQ(generation(), 5);
  EXPECT_TRUE(*store_->revoke_node(node_id(1)));
  EXPECT_EQ(generation(), 6);
  ASSERT_TRUE(store_->bump_market_generation());
  EXPECT_EQ(generation(), 7);
}

// Threads sharing one store (on PostgreSQL with a connection each): exclusive read-then-write bodies stay
// serialised, a transaction's calls stay in it, and concurrent bumps all count.
TEST_P(StoreTest, ThreadsOnSeveralConnectionsStaySerialised) {
  auto s = open_store(spec_, 4);
  ASSERT_TRUE(s) << s.status().message();
  Store& db = **s;
  ASSERT_TRUE(db.add_node(node(1)));
  constexpr int kThreads = 4, kEach = 25;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kEach; ++i) {
        // Read the ledger, then write read + 1 through a call that would otherwise be its own transaction.
        Status st = db.exclusive([&]() -> Status {
          ESSAIM_ASSIGN_OR_RETURN(std::vector<WorkRow> w, db.list_work());
          const int64_t seen = w.empty() ? 0 : w[0].pairs_credited;
          ESSAIM_RETURN_IF_ERROR(db.add_work(node_id(1), {.pairs = 1}, ""));
          ESSAIM_ASSIGN_OR_RETURN(std::vector<WorkRow> after, db.list_work());
          if (after.size() != 1 || after[0].pairs_credited != seen + 1) return Status::error("not serialised");
          return Status::ok();
        });
        if (!st || !db.bump_market_generation()) ++failures;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(db.list_work()->at(0).pairs_credited, kThreads * kEach);
  EXPECT_EQ(db.market_generation().value().value(), kThreads * kEach);
  EXPECT_GE(db.writes().transactions, uint64_t(2 * kThreads * kEach));
}

// Rows written by someone else: a node id, a digest, a status that do not validate are skipped, not trusted.
TEST_P(StoreTest, InvalidRowsAreSkipped) {
  ASSERT_TRUE(store_->add_node(node(1)));
  auto c = GetParam() == "postgresql" ? open_pg_connection(spec_) : open_sqlite_connection(spec_);
  ASSERT_TRUE(c);
  ASSERT_TRUE((*c)->query("INSERT INTO nodes (node_id, name, token_sha256, registered_ms) VALUES ('../../x', 'evil', 'zz', 1)"));
  ASSERT_TRUE((*c)->query("INSERT INTO nodes (node_id, name, token_sha256, registered_ms, status) VALUES "
                          "('n-00000000000000aa', 'odd', $1, 2, 'king')", {hex64('e')}));
  ASSERT_TRUE((*c)->query("INSERT INTO holdings VALUES ($1, -3, 0, 32, $2)", {node_id(1), hex64('f')}));
  ASSERT_TRUE((*c)->query("INSERT INTO holdings VALUES ($1, 3, 0, 32, 'short')", {node_id(1)}));
  auto nodes = store_->list_nodes();
  ASSERT_TRUE(nodes);
  ASSERT_EQ(nodes->size(), 1u);
  EXPECT_TRUE(store_->list_holdings()->empty());
  EXPECT_GE(store_->invalid_rows(), 4u);
}

TEST_P(StoreTest, SchemaVersionIsChecked) {
  auto c = GetParam() == "postgresql" ? open_pg_connection(spec_) : open_sqlite_connection(spec_);
  ASSERT_TRUE(c);
  ASSERT_TRUE((*c)->query("UPDATE meta SET value = '99' WHERE key = 'schema_version'"));
  store_.reset();
  auto again = open_store(spec_);
  ASSERT_FALSE(again);
  EXPECT_NE(again.status().message().find("schema version is 99"), std::string::npos) << again.status().message();
}

// A child process commits heartbeats and work reports as fast as it can and tells the parent, through a
// pipe, each sequence number once its transaction has committed; the parent kills it with SIGKILL at a
// random moment, reopens the store and finds every reported row.
TEST_P(StoreTest, KillNineLosesNoCommittedRow) {
  ASSERT_TRUE(store_->add_node(node(1)));
  store_.reset();
  std::mt19937 rng(42);
  for (int round = 0; round < 3; ++round) {
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      close(fds[0]);
      auto s = open_store(spec_);
      if (!s) _exit(3);
      for (int64_t seq = 1;; ++seq) {
        NodeRow f{.node_id = node_id(1), .name = "node-1", .token_sha256 = hex64('1'), .registered_ms = 1001};
        f.address = "127.0.0.1:" + std::to_string(round);
        f.last_heartbeat_ms = round * 1'000'000 + seq;
        if (!(*s)->heartbeat(f, {{f.node_id, 1, seq % 64, 1, hex64('a')}})) _exit(4);
        if (!(*s)->add_work(node_id(1), {1, 0, 0}, "")) _exit(5);
        if (write(fds[1], &seq, sizeof seq) != sizeof seq) _exit(6);
      }
    }
    close(fds[1]);
    // The kill lands at a random moment after the first commit (on a loaded machine the writer may take a
    // while to connect): its first sequence number is awaited, then the writer runs on for 50-250 ms.
    int64_t seq = 0, last = 0;
    const bool first = read(fds[0], &seq, sizeof seq) == sizeof seq;  // EOF if the writer died first
    if (first) last = seq;
    usleep(useconds_t(50'000 + rng() % 200'000));
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the writer exited by itself: " << WEXITSTATUS(status);
    while (read(fds[0], &seq, sizeof seq) == sizeof seq) last = seq;
    close(fds[0]);
    ASSERT_GT(last, 0) << "the writer committed nothing before the kill";
    auto s = open_store(spec_);
    ASSERT_TRUE(s) << s.status().message();
    const NodeRow n = (*(*s)->list_nodes())[0];
    EXPECT_GE(n.last_heartbeat_ms, round * 1'000'000 + last);  // committed heartbeats survive (one more may have)
    static int64_t total = 0;
    if (round == 0) total = 0;
    auto w = (*s)->list_work();
    ASSERT_TRUE(w);
    total += last;
    EXPECT_GE((*w)[0].pairs_credited, total);
    total = (*w)[0].pairs_credited;  // what the next round adds to
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, StoreTest, ::testing::Values("sqlite", "postgresql"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace essaim::coord
