// The handshake's decision, as a pure function (the exchange itself is net::handshake). Both peers send a
// HELLO first; each checks the other's with check_hello and answers HELLO_ACK or REFUSE:
//
//   std::optional<Refuse> no = check_hello(my_hello, their_hello);
//   send(no ? Message(*no) : Message(HelloAck{}));
//
// Refusal reasons, in the order they are checked: VERSION (protocol versions differ), ROLE (not one
// backbone and one worker), FINGERPRINT (kernel ABI differs, or ISA class under require_same_isa), MODEL
// (different model identity), LIMITS (a peer announces a frame limit below kMinMaxPayloadBytes).
// Then policy.check_peer, when set (WEIGHTS, BUSY, ...).
#pragma once

#include <functional>
#include <optional>

#include "proto/messages.h"

namespace essaim::proto {

struct HandshakePolicy {
  // Off by default: kernels are bit-exact across ISAs, so a NEON phone may serve an AVX-512 backbone.
  // On, for deployments that want identical builds everywhere (a sampled-recompute audit, say).
  bool require_same_isa = false;
  // Called with the peer's HELLO once check_hello has accepted it, before HELLO_ACK is sent: the caller's
  // own checks (the backbone compares the holdings' content digests with its bytes; a listener's admission
  // marks the connection authenticated). A Refuse is sent to the peer as is. Null: accept.
  std::function<std::optional<Refuse>(const Hello& theirs)> check_peer{};
};

// nullopt when `theirs` is acceptable to a peer that sent `mine`; otherwise the REFUSE to send, with a
// message that names both sides' values.
std::optional<Refuse> check_hello(const Hello& mine, const Hello& theirs, const HandshakePolicy& policy = {});

}  // namespace essaim::proto
