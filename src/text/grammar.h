// A context-free grammar over bytes and the matcher that constrains sampling with it (structured output:
// JSON schemas, tool calls; text/json_schema_grammar.h builds the grammars). The matcher advances by the
// sampled token's bytes (incremental: nothing is re-parsed) and gives, per step, the set of tokens whose bytes
// the grammar can still take — by walking a trie of the vocabulary's token bytes against the grammar state
// instead of testing every token on its own.
//
//   GrammarBuilder b;
//   const uint32_t digits = b.star({b.bytes('0', '9')});
//   b.set_root(b.rule({b.seq({b.literal("n="), {b.ref(digits)}})}));
//   ESSAIM_ASSIGN_OR_RETURN(std::shared_ptr<const Grammar> g, b.build());
//   TokenTrie trie(tokenizer);                      // once per vocabulary
//   GrammarMatcher m(g);
//   const TokenMask& allowed = m.allowed(trie, eog_ids);   // tokens the grammar takes next (EOG when it is complete)
//   m.accept_bytes(tokenizer.token_to_piece(chosen));      // false: the grammar rejects them
//
// How the state is kept: a state is the set of parse stacks whose next element is a byte set (an Earley-free
// pushdown: rules are alternatives of sequences of byte sets and rule references, never left-recursive; a
// reference in tail position replaces its frame, so a repetition written `R ::= x R | ε` keeps its stack flat).
// Frames are hash-consed (equal stacks are equal ids) and states interned, so the matcher is a DFA built lazily
// over the stack configurations it meets: a byte from a known state is one table lookup, and a state's token
// mask is computed once and cached. Grammars built here have no recursion, so the configurations are finite;
// they are also bounded (GrammarLimits): past the limit the matcher reports an error instead of growing.
#pragma once

#include <array>
#include <bitset>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "text/vocab.h"

namespace essaim {

class Tokenizer;

using ByteSet = std::bitset<256>;

struct GrammarElement {
  enum class Kind : uint8_t { BYTES, RULE, END };
  Kind kind = Kind::END;
  uint32_t ref = 0;  // BYTES: index into the byte-set table; RULE: rule id
};

// What a grammar may grow to; a schema past them is refused (docs/serve.md, "Structured output").
struct GrammarLimits {
  size_t max_elements = 1u << 20;   // elements of the compiled grammar
  size_t max_states = 1u << 16;     // distinct matcher states (stack configurations) per sequence
  size_t max_frames = 1u << 20;     // distinct stack frames per sequence
  size_t max_stacks = 256;          // parse stacks alive in one state (ambiguity)
  size_t max_cached_masks = 32;     // token masks kept per sequence (least recently used dropped)
};

class Grammar {
 public:
  const std::vector<GrammarElement>& elements() const { return elements_; }
  const ByteSet& byte_set(uint32_t i) const { return sets_[i]; }
  std::span<const uint32_t> alternatives(uint32_t rule) const { return rule_alts_[rule]; }
  uint32_t root() const { return root_; }
  size_t n_rules() const { return rule_alts_.size(); }
  const GrammarLimits& limits() const { return limits_; }

 private:
  friend class GrammarBuilder;
  std::vector<ByteSet> sets_;
  std::vector<GrammarElement> elements_;           // each alternative's sequence, END-terminated
  std::vector<std::vector<uint32_t>> rule_alts_;   // rule -> index in elements_ of each alternative's start
  uint32_t root_ = 0;
  GrammarLimits limits_;
};

// Builds a Grammar. A Seq is a sequence of elements; rules are declared first (new_rule) when they are
// referenced before their alternatives are known.
class GrammarBuilder {
 public:
  using Seq = std::vector<GrammarElement>;
  explicit GrammarBuilder(GrammarLimits limits = {}) { g_.limits_ = limits; }

  uint32_t new_rule();
  void add_alt(uint32_t rule, Seq seq);
  uint32_t rule(std::vector<Seq> alternatives);  // a new rule with these alternatives
  void set_root(uint32_t rule) { g_.root_ = rule; }

  GrammarElement bytes(const ByteSet& set);
  GrammarElement bytes(uint8_t lo, uint8_t hi);  // the range lo..hi
  GrammarElement ref(uint32_t rule) const { return {GrammarElement::Kind::RULE, rule}; }
  Seq literal(std::string_view text);
  static Seq seq(std::initializer_list<Seq> parts);

  uint32_t star(Seq item);                            // item*
  uint32_t optional(Seq item);                        // item?
  // item{min,max}; max < 0: unbounded. Unrolled: min copies, then max - min nested optionals.
  uint32_t repeat(Seq item, int64_t min, int64_t max);

  // Fails when the grammar outgrew max_elements, or a rule has no alternative.
  Result<std::shared_ptr<const Grammar>> build();
  size_t size() const { return g_.elements_.size() + pending_elements_; }

 private:
  Grammar g_;
  std::vector<std::vector<Seq>> pending_;  // rule -> alternatives, flattened by build()
  size_t pending_elements_ = 0;
  std::unordered_map<std::string, uint32_t> set_ids_;
};

// The bytes of every token, as a trie (children sorted by byte, nodes in depth-first order so that a subtree's
// tokens are one range), built once per vocabulary. Each node knows the bytes found below it, so that a
// subtree whose every byte keeps the grammar in the same state (a string's plain characters) is taken whole
// without walking it. Tokens that render no bytes (control tokens, unused ids) are not in it: a grammar never
// allows them; end-of-generation ids are allowed apart, when the grammar is complete.
class TokenTrie {
 public:
  explicit TokenTrie(const Tokenizer& tokenizer);
  struct Node {
    uint32_t first_edge = 0, n_edges = 0;
    uint32_t first_token = 0, n_tokens = 0;  // tokens whose bytes end here
    uint32_t end_token = 0;                  // the subtree's tokens: [first_token, end_token)
    uint32_t below = 0;                      // index of the set of bytes on the subtree's edges
  };
  struct Edge {
    uint8_t byte;
    uint32_t node;
  };
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<Edge>& edges() const { return edges_; }
  std::span<const TokenId> tokens_at(const Node& n) const { return {tokens_.data() + n.first_token, n.n_tokens}; }
  std::span<const TokenId> tokens_below(const Node& n) const {
    return {tokens_.data() + n.first_token, n.end_token - n.first_token};
  }
  const ByteSet& bytes_below(const Node& n) const { return below_sets_[n.below]; }
  const std::string& piece(TokenId id) const { return pieces_[size_t(id)]; }
  int32_t n_vocab() const { return int32_t(pieces_.size()); }

 private:
  std::vector<Node> nodes_;
  std::vector<Edge> edges_;
  std::vector<TokenId> tokens_;
  std::vector<std::string> pieces_;
  std::vector<ByteSet> below_sets_;  // interned
};

// Allowed token ids as a bit set over the vocabulary.
struct TokenMask {
  std::vector<uint64_t> bits;
  void reset(int32_t n_vocab) { bits.assign((size_t(n_vocab) + 63) / 64, 0); }
  void set(TokenId id) { bits[size_t(id) >> 6] |= uint64_t(1) << (id & 63); }
  bool test(TokenId id) const { return (bits[size_t(id) >> 6] >> (id & 63)) & 1; }
  size_t count() const;
};

class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const Grammar> grammar);

  // Advances by these bytes; false (and the state unchanged) when the grammar rejects them, or when a limit
  // was passed (error() says which).
  bool accept_bytes(std::string_view bytes);
  // Whether accept_bytes(bytes) would succeed, without advancing (a draft token checked against the grammar).
  bool can_accept(std::string_view bytes);
  // Whether the bytes so far are a complete sentence of the grammar (end of generation may come now).
  bool complete() const;
  // Whether some byte may still follow.
  bool can_continue() const;
  // The tokens the grammar takes next: those whose bytes keep a parse alive, and `eog` ids when complete().
  // Cached per state. An error (a limit passed while walking) leaves the mask empty and error() set.
  const TokenMask& allowed(const TokenTrie& trie, std::span<const TokenId> eog);
  const std::string& error() const { return error_; }

  size_t n_states() const { return states_.size(); }
  size_t n_mask_walks() const { return walks_; }  // masks computed (the others came from the cache)

 private:
  struct Frame {
    uint32_t pc;     // index in elements(): the next element to match
    int32_t parent;  // the frame to return to, or -1
  };
  struct State {
    std::vector<int32_t> tops;  // frames whose element is BYTES, sorted
    bool complete = false;
    std::unique_ptr<std::array<int32_t, 256>> next;  // transitions, filled lazily (kUnknown)
    std::unique_ptr<ByteSet> loops;                  // bytes that lead back to this state, once asked
  };
  int32_t frame(uint32_t pc, int32_t parent);
  bool expand(int32_t f, std::vector<int32_t>& tops, bool& complete, int depth);
  int32_t intern(std::vector<int32_t> tops, bool complete);
  int32_t step(int32_t state, uint8_t byte);  // -1: rejected, -2: a limit passed
  const ByteSet* loops(int32_t state);         // null when a limit passed
  void walk(const TokenTrie& trie, uint32_t node, int32_t state, TokenMask& mask);
  void fail(std::string why);

  std::shared_ptr<const Grammar> g_;
  std::vector<Frame> frames_;
  std::unordered_map<uint64_t, int32_t> frame_ids_;
  std::vector<State> states_;
  std::unordered_map<std::string, int32_t> state_ids_;
  int32_t current_ = -1;
  std::string error_;
  struct CachedMask {
    int32_t state;
    uint64_t used;
    TokenMask mask;
  };
  std::vector<CachedMask> masks_;
  uint64_t clock_ = 0;
  size_t walks_ = 0;
  TokenMask empty_;
};

}  // namespace essaim
