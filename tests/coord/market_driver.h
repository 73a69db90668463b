// A real coord::Coordinator (a SQLite store file, the clock the test moves) asked through its HTTP handlers
// (Coordinator::answer(), no listener), for the tests that play market schedules against it: the market view
// test (tests/coord) and essaim-sim's market test (tests/sim). Nodes are addressed by the name the test gives
// them; their ids and tokens stay inside (two coordinators give one name different ids).
//
//   int64_t now = 1'700'000'000'000;
//   const Catalogue cat = small_catalogue();              // 3 layers x 16 experts, slices of 4
//   MarketDriver m(cat, dir / "coord.sqlite", now);
//   m.add_node("a");
//   now += 1000;
//   const bool told = m.heartbeat("a", {0, 1}, 500, false);  // holds slices 0 and 1, 500 bytes of room
//   const json choice = m.volunteer("a", {0, 1}, 500);      // {"assign": [...], "drop": [...], "swap": [...]}
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "coord/coordinator.h"

namespace essaim::coord::testing {

// 3 layers of 16 experts (4 used) in slices of 4 experts, of 100 to 120 bytes, each with its own digest.
Catalogue small_catalogue();
// The bytes of the catalogue slices `held` (indices).
int64_t held_bytes(const Catalogue& cat, const std::vector<size_t>& held);
// One turn of a scheduled node, as worker/joined_worker.cpp's loop: `heartbeat` (returns the volunteer flag);
// volunteer rounds when told, or with room for a small_catalogue() slice (100 bytes), or (a draw from `rng`, made
// only for a full node untold: the schedules' seeds depend on it) one turn in 5 anyway; after a round that
// changed the held set (`volunteer_round` returns whether it did) a heartbeat and again, 4 rounds at most.
void joined_worker_turn(int64_t held_bytes, int64_t budget, std::mt19937_64& rng,
                        const std::function<bool()>& heartbeat, const std::function<bool()>& volunteer_round);

class MarketDriver {
 public:
  using json = nlohmann::json;
  // `now` is read by the coordinator at every request: the test moves time by changing it.
  MarketDriver(const Catalogue& cat, std::filesystem::path store_file, const int64_t& now);
  ~MarketDriver();
  MarketDriver(const MarketDriver&) = delete;
  MarketDriver& operator=(const MarketDriver&) = delete;

  // A restart: the process and its memory gone, the store file kept.
  void restart();
  Store& store() { return *store_; }

  // Registered by the admin (POST /api/nodes).
  void add_node(const std::string& name);
  // A node registered elsewhere (straight in the store, or by another coordinator on the same file).
  void know(const std::string& name, const std::string& id, const std::string& token);
  const std::string& id(const std::string& name) const { return ids_.at(name); }
  const std::string& token(const std::string& name) const { return tokens_.at(name); }
  void revoke(const std::string& name);

  // POST /api/expert-coverage: holding the catalogue slices `held` (indices), `capacity` bytes of room,
  // or leaving (then holding nothing). Returns the answer's `volunteer` flag.
  bool heartbeat(const std::string& name, const std::vector<size_t>& held, int64_t capacity, bool leaving);
  // POST /api/expert-volunteer: the answer as sent (ranges in "assign", "drop", "swap" take/give_up).
  json volunteer(const std::string& name, const std::vector<size_t>& held, int64_t budget);
  // GET /api/expert-map with node ids replaced by names, and its generation left out (it digests the ids).
  json expert_map();
  json demand();  // GET /api/expert-demand

 private:
  void start();
  json call(const std::string& method, const std::string& path, const json& body, const std::string& token);
  json range(size_t slice, bool with_sha) const;

  const Catalogue& cat_;
  std::filesystem::path file_;
  const int64_t& now_;
  Store* store_ = nullptr;  // owned by coord_
  std::unique_ptr<Coordinator> coord_;
  std::map<std::string, std::string> ids_, names_, tokens_;
};

}  // namespace essaim::coord::testing
