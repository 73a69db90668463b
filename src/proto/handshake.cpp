#include "proto/handshake.h"

#include <string>

namespace essaim::proto {

std::optional<Refuse> check_hello(const Hello& mine, const Hello& theirs, const HandshakePolicy& policy) {
  auto refuse = [](RefuseReason reason, std::string message) {
    return std::optional<Refuse>(Refuse{reason, std::move(message)});
  };
  if (theirs.version != mine.version) {
    return refuse(RefuseReason::VERSION, "peer speaks protocol v" + std::to_string(theirs.version) +
                                             ", this node speaks v" + std::to_string(mine.version));
  }
  if (theirs.role == mine.role) {
    return refuse(RefuseReason::ROLE, "both peers are a " + std::string(role_name(mine.role)) +
                                          "; a connection joins one backbone and one worker");
  }
  const BuildFingerprint& a = mine.fingerprint;
  const BuildFingerprint& b = theirs.fingerprint;
  if (b.kernel_abi != a.kernel_abi) {
    return refuse(RefuseReason::FINGERPRINT,
                  "peer's kernel ABI is " + std::to_string(b.kernel_abi) + " (" + b.isa_class +
                      "), this node's is " + std::to_string(a.kernel_abi) + " (" + a.isa_class +
                      "): results would not be bit-identical; run the same essaim release on both");
  }
  if (policy.require_same_isa && b.isa_class != a.isa_class) {
    return refuse(RefuseReason::FINGERPRINT, "peer's ISA class is '" + b.isa_class + "', this node requires '" +
                                                 a.isa_class + "'");
  }
  if (theirs.model != mine.model) {
    return refuse(RefuseReason::MODEL, "peer serves model " + model_id_hex(theirs.model).substr(0, 16) +
                                           "..., this node serves " + model_id_hex(mine.model).substr(0, 16) +
                                           "...: slices must be cut from the backbone's model");
  }
  if (theirs.max_payload_bytes < kMinMaxPayloadBytes) {
    return refuse(RefuseReason::LIMITS, "peer accepts frames of at most " +
                                            std::to_string(theirs.max_payload_bytes) +
                                            " bytes; the protocol needs at least " +
                                            std::to_string(kMinMaxPayloadBytes));
  }
  if (policy.check_peer) return policy.check_peer(theirs);
  return std::nullopt;
}

}  // namespace essaim::proto
