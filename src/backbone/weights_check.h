// The backbone's check that a worker's expert bytes are its own (docs/protocol.md, WEIGHTS): each announced
// holding carries the content digest of its experts (slice/expert_digest.h), and the backbone compares it
// with the digest of the same experts in its full model file before it accepts the worker.
//
//   ESSAIM_ASSIGN_OR_RETURN(auto check, weights_check(model.file()));
//   options.link.policy.check_peer = check;     // a mismatch is refused (REFUSE WEIGHTS), never paired
//
// The model file's digests are computed lazily — only the experts some worker claims, once — and kept
// beside the file (ExpertDigestCache), so a 77 GB model is not re-hashed per run, and a worker holding 32
// experts of one layer costs the first handshake about one read of those experts' bytes.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "core/status.h"
#include "gguf/gguf_file.h"
#include "proto/messages.h"

namespace essaim::backbone {

using PeerCheck = std::function<std::optional<proto::Refuse>(const proto::Hello&)>;

// `file` (a full model, or a backbone file: then the digests it records are used and nothing is hashed)
// must outlive the returned function. Holdings outside the model's MoE layers or
// experts are not checked here: the dispatcher never routes them (routable_holdings).
Result<PeerCheck> weights_check(const GgufFile& file, std::string cache_path = {});

// Both checks in turn; either may be null.
PeerCheck both_checks(PeerCheck first, PeerCheck second);

}  // namespace essaim::backbone
