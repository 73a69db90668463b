// What decide_volunteer reads of the market's state, indexed: every quantity it needs is a sum of per-node
// terms (a node's valid holdings, its pending moves, its room), so the index keeps each node's terms and
// their sums, and one node's change costs that node's rows, not the swarm's. A decision for one asker then
// costs O(slices log slices + held x 1) instead of O(nodes + holdings + pending).
//
//   MarketIndex idx = MarketIndex::from_snapshot(cat, snapshot, pending, now_ms, heartbeat_s);
//   VolunteerChoice c = idx.decide({node_id, held, budget, now_ms}, replicas);        // = decide_volunteer
//   idx.set_node(&row, its_holdings, its_live_pending, now_ms);                        // one node changed
//
// A node's terms depend on the clock only through its freshness (node_is_holder, and "gone" for its
// reservations): set_node computes them for `now_ms`, and the caller sets the node again once the clock
// passes term_boundary() (essaim-sim keeps a queue of these). Node ids are unique (the store's key).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "coord/placement.h"

namespace essaim::coord {

class MarketIndex {
 public:
  MarketIndex(const Catalogue& cat, int64_t heartbeat_s);
  // Every node of the snapshot and every pending row's node (pending: the unexpired reservations).
  static MarketIndex from_snapshot(const Catalogue& cat, const MarketSnapshot& s,
                                   const std::vector<PendingRow>& pending, int64_t now_ms, int64_t heartbeat_s);

  // The node `node_id`'s rows replace what it contributed: `row` (nullptr: a reservation's node with no node
  // row), all its holding rows, its unexpired reservations; freshness judged at now_ms.
  void set_node(const std::string& node_id, const NodeRow* row, const std::vector<const HoldingRow*>& holdings,
                const std::vector<const PendingRow*>& pending, int64_t now_ms);
  void remove_node(const std::string& node_id);
  void set_usage(std::vector<double> shares) { usage_ = std::move(shares); }

  // decide_volunteer's answer for `ask` (ask.now_ms must be the time the nodes were set at or one before
  // their term boundaries).
  VolunteerChoice decide(const VolunteerAsk& ask, int64_t replicas) const;
  // The holder counts `asker` decides from: holders now, plus every other live node's pending moves.
  std::vector<int64_t> future_holders(const std::string& asker) const;
  // What expert_map lists for the node: its valid holdings, sorted, if it is a healthy holder with an address
  // and one; else nullptr.
  const std::vector<size_t>* map_slices(const std::string& node_id) const;
  // The first time after now_ms at which a node with these rows changes its terms (its heartbeat goes stale
  // or a reservation expires); INT64_MAX if never.
  static int64_t term_boundary(const NodeRow* row, const std::vector<const PendingRow*>& pending, int64_t now_ms,
                               int64_t heartbeat_s);

 private:
  struct Move {
    size_t slice = 0;
    int delta = 0;  // +1 a take, -1 a give-up
  };
  // One node's contribution.
  struct Terms {
    std::vector<size_t> valid;    // its valid holdings if it is a healthy holder (the map's slices, sorted)
    std::vector<Move> moves;      // its reservations still to land, if it is not gone
    bool in_room = false;         // listed in the map: a healthy holder with an address and a valid holding
    std::vector<size_t> serving;  // in_room: valid holdings not being given up
    std::vector<size_t> future;   // in_room: distinct slices once its moves land, sorted
    int64_t left = 0;             // in_room: budget less the future slices' bytes
  };
  Terms terms_of(const NodeRow* row, const std::vector<const HoldingRow*>& holdings,
                 const std::vector<const PendingRow*>& pending, int64_t now_ms) const;
  void apply(const Terms& t, int sign);
  int64_t takers(size_t slice, const Terms* asker) const;

  const Catalogue* cat_;
  int64_t heartbeat_s_;
  std::vector<size_t> size_class_;   // per slice: index into sizes_
  std::vector<int64_t> sizes_;       // the catalogue's distinct slice sizes, ascending
  std::unordered_map<std::string, Terms> nodes_;
  std::vector<int64_t> holders_;     // per slice: valid holdings of healthy holders + every node's moves
  std::vector<int64_t> serving_;     // per slice: room nodes serving it
  std::vector<int64_t> fit_;         // per size: room nodes with left >= that size
  std::vector<int64_t> holders_fit_;  // per slice: room nodes whose future holds it, with left >= its bytes
  std::vector<double> usage_;
};

}  // namespace essaim::coord
