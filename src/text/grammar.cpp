#include "text/grammar.h"

#include <algorithm>
#include <map>

#include "text/tokenizer.h"

namespace essaim {
namespace {

constexpr int32_t kRejected = -1;
constexpr int32_t kLimit = -2;
constexpr int32_t kUnknown = -3;
constexpr int kMaxExpandDepth = 512;  // rule references followed without consuming a byte

}  // namespace

// ---- building ----

uint32_t GrammarBuilder::new_rule() {
  pending_.emplace_back();
  return uint32_t(pending_.size() - 1);
}

void GrammarBuilder::add_alt(uint32_t rule, Seq seq) {
  pending_elements_ += seq.size() + 1;
  pending_[rule].push_back(std::move(seq));
}

uint32_t GrammarBuilder::rule(std::vector<Seq> alternatives) {
  const uint32_t r = new_rule();
  for (Seq& s : alternatives) add_alt(r, std::move(s));
  return r;
}

GrammarElement GrammarBuilder::bytes(const ByteSet& set) {
  const std::string key = set.to_string();
  auto [it, fresh] = set_ids_.try_emplace(key, uint32_t(g_.sets_.size()));
  if (fresh) g_.sets_.push_back(set);
  return {GrammarElement::Kind::BYTES, it->second};
}

GrammarElement GrammarBuilder::bytes(uint8_t lo, uint8_t hi) {
  ByteSet s;
  for (unsigned c = lo; c <= hi; ++c) s.set(c);
  return bytes(s);
}

GrammarBuilder::Seq GrammarBuilder::literal(std::string_view text) {
  Seq s;
  for (char c : text) s.push_back(bytes(uint8_t(c), uint8_t(c)));
  return s;
}

GrammarBuilder::Seq GrammarBuilder::seq(std::initializer_list<Seq> parts) {
  Seq out;
  for (const Seq& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

uint32_t GrammarBuilder::star(Seq item) {
  const uint32_t r = new_rule();
  item.push_back(ref(r));  // tail position: the matcher replaces the frame, the stack stays flat
  add_alt(r, std::move(item));
  add_alt(r, {});
  return r;
}

uint32_t GrammarBuilder::optional(Seq item) { return rule({std::move(item), {}}); }

uint32_t GrammarBuilder::repeat(Seq item, int64_t min, int64_t max) {
  if (item.size() > 1) item = {ref(rule({std::move(item)}))};  // copies below are one element each
  Seq body;
  for (int64_t i = 0; i < min; ++i) body.insert(body.end(), item.begin(), item.end());
  if (max < 0) {
    body.push_back(ref(star(item)));
  } else if (max > min) {
    uint32_t tail = rule({{}});
    for (int64_t i = min + 1; i < max; ++i) tail = rule({seq({item, {ref(tail)}}), {}});
    tail = rule({seq({item, {ref(tail)}}), {}});
    body.push_back(ref(tail));
  }
  return rule({std::move(body)});
}

Result<std::shared_ptr<const Grammar>> GrammarBuilder::build() {
  if (size() > g_.limits_.max_elements)
    return Status::error("the grammar has " + std::to_string(size()) + " elements, over the limit of " +
                         std::to_string(g_.limits_.max_elements));
  if (g_.root_ >= pending_.size()) return Status::error("the grammar has no root rule");
  g_.rule_alts_.assign(pending_.size(), {});
  for (size_t r = 0; r < pending_.size(); ++r) {
    if (pending_[r].empty()) return Status::error("internal: grammar rule " + std::to_string(r) + " has no alternative");
    for (Seq& alt : pending_[r]) {
      g_.rule_alts_[r].push_back(uint32_t(g_.elements_.size()));
      for (const GrammarElement& e : alt) {
        if (e.kind == GrammarElement::Kind::RULE && e.ref >= pending_.size())
          return Status::error("internal: reference to an undeclared grammar rule");
        g_.elements_.push_back(e);
      }
      g_.elements_.push_back({GrammarElement::Kind::END, 0});
    }
  }
  pending_.clear();
  pending_elements_ = 0;
  return std::shared_ptr<const Grammar>(std::make_shared<Grammar>(std::move(g_)));
}

// ---- the vocabulary's trie ----

TokenTrie::TokenTrie(const Tokenizer& tok) {
  struct Tmp {
    std::map<uint8_t, uint32_t> kids;
    std::vector<TokenId> toks;
  };
  std::vector<Tmp> tmp(1);
  pieces_.resize(size_t(tok.n_vocab()));
  for (TokenId id = 0; id < tok.n_vocab(); ++id) {
    const TokenType t = tok.type(id);
    if (t == TokenType::CONTROL || t == TokenType::UNUSED || t == TokenType::UNKNOWN) continue;
    pieces_[size_t(id)] = tok.token_to_piece(id);
    const std::string& p = pieces_[size_t(id)];
    if (p.empty()) continue;
    uint32_t n = 0;
    for (char c : p) {
      auto it = tmp[n].kids.find(uint8_t(c));
      if (it == tmp[n].kids.end()) {
        tmp.emplace_back();
        it = tmp[n].kids.emplace(uint8_t(c), uint32_t(tmp.size() - 1)).first;
      }
      n = it->second;
    }
    tmp[n].toks.push_back(id);
  }
  // Flattened depth first: a node's subtree is the nodes (and tokens) that follow it up to its end.
  std::unordered_map<std::string, uint32_t> set_ids;
  const auto flatten = [&](auto& self, uint32_t t) -> uint32_t {
    const uint32_t id = uint32_t(nodes_.size());
    nodes_.push_back({});
    nodes_[id].first_token = uint32_t(tokens_.size());
    nodes_[id].n_tokens = uint32_t(tmp[t].toks.size());
    tokens_.insert(tokens_.end(), tmp[t].toks.begin(), tmp[t].toks.end());
    const uint32_t first_edge = uint32_t(edges_.size());
    nodes_[id].first_edge = first_edge;
    nodes_[id].n_edges = uint32_t(tmp[t].kids.size());
    edges_.resize(edges_.size() + tmp[t].kids.size());
    ByteSet below;
    uint32_t i = 0;
    for (const auto& [b, kid] : tmp[t].kids) {
      const uint32_t child = self(self, kid);
      edges_[first_edge + i++] = {b, child};
      below.set(b);
      below |= below_sets_[nodes_[child].below];
    }
    nodes_[id].end_token = uint32_t(tokens_.size());
    auto [it, fresh] = set_ids.try_emplace(below.to_string(), uint32_t(below_sets_.size()));
    if (fresh) below_sets_.push_back(below);
    nodes_[id].below = it->second;
    return id;
  };
  nodes_.reserve(tmp.size());
  edges_.reserve(tmp.size());
  flatten(flatten, 0);
}

size_t TokenMask::count() const {
  size_t n = 0;
  for (uint64_t w : bits) n += size_t(__builtin_popcountll(w));
  return n;
}

// ---- matching ----

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar) : g_(std::move(grammar)) {
  std::vector<int32_t> tops;
  bool complete = false;
  for (uint32_t alt : g_->alternatives(g_->root())) {
    const int32_t f = frame(alt, -1);
    if (f < 0 || !expand(f, tops, complete, 0)) return;
  }
  current_ = intern(std::move(tops), complete);
}

void GrammarMatcher::fail(std::string why) {
  if (error_.empty()) error_ = std::move(why);
}

int32_t GrammarMatcher::frame(uint32_t pc, int32_t parent) {
  const uint64_t key = (uint64_t(pc) << 32) | uint32_t(parent + 1);
  const auto it = frame_ids_.find(key);
  if (it != frame_ids_.end()) return it->second;
  if (frames_.size() >= g_->limits().max_frames) {
    fail("the output grammar passed its limit of " + std::to_string(g_->limits().max_frames) + " parse frames");
    return -1;
  }
  frames_.push_back({pc, parent});
  frame_ids_.emplace(key, int32_t(frames_.size() - 1));
  return int32_t(frames_.size() - 1);
}

// Follows rule references and rule ends from frame f until every path stands before a byte set (a top) or
// has ended the root (complete). A reference in tail position returns straight to the caller's parent.
bool GrammarMatcher::expand(int32_t f, std::vector<int32_t>& tops, bool& complete, int depth) {
  if (depth > kMaxExpandDepth) {
    fail("the output grammar nests deeper than " + std::to_string(kMaxExpandDepth) + " rules");
    return false;
  }
  const std::vector<GrammarElement>& el = g_->elements();
  const Frame fr = frames_[size_t(f)];
  const GrammarElement& e = el[fr.pc];
  switch (e.kind) {
    case GrammarElement::Kind::BYTES:
      tops.push_back(f);
      return true;
    case GrammarElement::Kind::END:
      if (fr.parent < 0) {
        complete = true;
        return true;
      }
      return expand(fr.parent, tops, complete, depth + 1);
    case GrammarElement::Kind::RULE: {
      int32_t cont = fr.parent;
      if (el[fr.pc + 1].kind != GrammarElement::Kind::END) {
        cont = frame(fr.pc + 1, fr.parent);
        if (cont < 0) return false;
      }
      for (uint32_t alt : g_->alternatives(e.ref)) {
        const int32_t nf = frame(alt, cont);
        if (nf < 0 || !expand(nf, tops, complete, depth + 1)) return false;
      }
      return true;
    }
  }
  return false;
}

int32_t GrammarMatcher::intern(std::vector<int32_t> tops, bool complete) {
  std::sort(tops.begin(), tops.end());
  tops.erase(std::unique(tops.begin(), tops.end()), tops.end());
  if (tops.size() > g_->limits().max_stacks) {
    fail("the output grammar is too ambiguous: " + std::to_string(tops.size()) + " parses alive at once (limit " +
         std::to_string(g_->limits().max_stacks) + ")");
    return kLimit;
  }
  std::string key(reinterpret_cast<const char*>(tops.data()), tops.size() * sizeof(int32_t));
  key.push_back(complete ? '1' : '0');
  const auto it = state_ids_.find(key);
  if (it != state_ids_.end()) return it->second;
  if (states_.size() >= g_->limits().max_states) {
    fail("the output grammar passed its limit of " + std::to_string(g_->limits().max_states) + " states");
    return kLimit;
  }
  states_.push_back({.tops = std::move(tops), .complete = complete, .next = nullptr});
  state_ids_.emplace(std::move(key), int32_t(states_.size() - 1));
  return int32_t(states_.size() - 1);
}

int32_t GrammarMatcher::step(int32_t state, uint8_t byte) {
  if (states_[size_t(state)].next) {
    const int32_t known = (*states_[size_t(state)].next)[byte];
    if (known != kUnknown) return known;
  }
  const std::vector<int32_t> from = states_[size_t(state)].tops;  // a copy: interning may move states_
  std::vector<int32_t> tops;
  bool complete = false;
  for (int32_t t : from) {
    const Frame fr = frames_[size_t(t)];
    if (!g_->byte_set(g_->elements()[fr.pc].ref).test(byte)) continue;
    const int32_t nf = frame(fr.pc + 1, fr.parent);
    if (nf < 0 || !expand(nf, tops, complete, 0)) return kLimit;
  }
  const int32_t next = tops.empty() && !complete ? kRejected : intern(std::move(tops), complete);
  if (next == kLimit) return kLimit;
  State& s = states_[size_t(state)];
  if (!s.next) {
    s.next = std::make_unique<std::array<int32_t, 256>>();
    s.next->fill(kUnknown);
  }
  (*s.next)[byte] = next;
  return next;
}

bool GrammarMatcher::accept_bytes(std::string_view bytes) {
  if (current_ < 0) return false;
  int32_t s = current_;
  for (char c : bytes) {
    s = step(s, uint8_t(c));
    if (s < 0) return false;
  }
  current_ = s;
  return true;
}

bool GrammarMatcher::can_accept(std::string_view bytes) {
  const int32_t before = current_;
  const bool ok = accept_bytes(bytes);
  current_ = before;
  return ok;
}

bool GrammarMatcher::complete() const { return current_ >= 0 && states_[size_t(current_)].complete; }
bool GrammarMatcher::can_continue() const { return current_ >= 0 && !states_[size_t(current_)].tops.empty(); }

const ByteSet* GrammarMatcher::loops(int32_t state) {
  if (!states_[size_t(state)].loops) {
    ByteSet l;
    for (unsigned b = 0; b < 256; ++b) {
      const int32_t next = step(state, uint8_t(b));
      if (next == kLimit) return nullptr;
      if (next == state) l.set(b);
    }
    states_[size_t(state)].loops = std::make_unique<ByteSet>(l);
  }
  return states_[size_t(state)].loops.get();
}

void GrammarMatcher::walk(const TokenTrie& trie, uint32_t node, int32_t state, TokenMask& mask) {
  const TokenTrie::Node& n = trie.nodes()[node];
  for (uint32_t i = 0; i < n.n_edges; ++i) {
    const TokenTrie::Edge& e = trie.edges()[n.first_edge + i];
    const int32_t next = step(state, e.byte);
    if (next == kLimit) return;
    if (next == kRejected) continue;
    const TokenTrie::Node& child = trie.nodes()[e.node];
    if (states_[size_t(next)].tops.empty()) {  // complete, nothing may follow: only the tokens ending here
      for (TokenId id : trie.tokens_at(child)) mask.set(id);
      continue;
    }
    // Every byte below keeps the state where it is (a string's plain characters): the whole subtree is taken.
    const ByteSet* l = child.n_edges == 0 ? nullptr : loops(next);
    if (!error_.empty()) return;
    if (l != nullptr && (trie.bytes_below(child) & ~*l).none()) {
      for (TokenId id : trie.tokens_below(child)) mask.set(id);
      continue;
    }
    for (TokenId id : trie.tokens_at(child)) mask.set(id);
    walk(trie, e.node, next, mask);
    if (!error_.empty()) return;
  }
}

const TokenMask& GrammarMatcher::allowed(const TokenTrie& trie, std::span<const TokenId> eog) {
  if (current_ < 0 || !error_.empty()) {
    empty_.reset(trie.n_vocab());
    return empty_;
  }
  ++clock_;
  for (CachedMask& c : masks_)
    if (c.state == current_) {
      c.used = clock_;
      return c.mask;
    }
  CachedMask fresh{.state = current_, .used = clock_, .mask = {}};
  ++walks_;
  fresh.mask.reset(trie.n_vocab());
  if (!states_[size_t(current_)].tops.empty()) walk(trie, 0, current_, fresh.mask);
  if (!error_.empty()) {
    empty_.reset(trie.n_vocab());
    return empty_;
  }
  if (complete())
    for (TokenId id : eog)
      if (id >= 0 && id < trie.n_vocab()) fresh.mask.set(id);
  if (masks_.size() < g_->limits().max_cached_masks) {
    masks_.push_back(std::move(fresh));
    return masks_.back().mask;
  }
  CachedMask& lru = *std::min_element(masks_.begin(), masks_.end(),
                                      [](const CachedMask& a, const CachedMask& b) { return a.used < b.used; });
  lru = std::move(fresh);
  return lru.mask;
}

}  // namespace essaim
