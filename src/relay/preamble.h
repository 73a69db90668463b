// The relay protocol's first message (docs/relay.md): who is connecting (worker or backbone), with which
// node token, which build, and for a backbone which worker it wants. Encoded and decoded here, for the
// relay server and for the clients that dial it.
//
//   std::vector<uint8_t> m = encode_preamble({.role = RelayRole::WORKER, .token = "...", .build = b});
//   Result<Preamble> p = decode_preamble(m);   // every malformed input is an error value, never a crash
//
// The relay answers a preamble with one message, PAIRED (1 byte), once the connection is paired; every
// refusal is a WebSocket close code with a reason text instead.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "proto/messages.h"

namespace essaim::relay {

inline constexpr uint8_t kPreambleVersion = 1;
inline constexpr size_t kMaxTokenBytes = 256;
inline constexpr size_t kMaxNodeIdBytes = 128;
inline constexpr size_t kMaxPreambleBytes = 1024;  // larger than any valid preamble
inline constexpr uint8_t kPairedMessage = 0x50;    // 'P': the relay's one message of its own

// The same values as proto::Role, so a log reads the same.
enum class RelayRole : uint8_t { BACKBONE = 1, WORKER = 2 };

// What both ends must agree on before they are paired: the model, the expert protocol, the kernels.
struct RelayBuild {
  proto::ModelId model{};
  uint16_t protocol_version = proto::kProtocolVersion;
  uint32_t kernel_abi = 0;
  bool operator==(const RelayBuild&) const = default;
  std::string text() const;  // "model 1a2b…, protocol 2, kernel ABI 7"
};

struct Preamble {
  RelayRole role = RelayRole::WORKER;
  std::string token;
  RelayBuild build;
  std::string node_id;  // a backbone: the worker it wants; empty for a worker
  bool operator==(const Preamble&) const = default;
};

std::vector<uint8_t> encode_preamble(const Preamble& p);
// Checks everything: version, role, lengths, characters (tokens and node ids are printable ASCII),
// that a backbone names a node and a worker does not, and that nothing follows.
Result<Preamble> decode_preamble(std::span<const uint8_t> bytes);

// Node ids and tokens: 1..max bytes of [A-Za-z0-9._~-].
bool valid_node_id(std::string_view s);
bool valid_token(std::string_view s);

}  // namespace essaim::relay
