#include "backbone/weights_check.h"

#include <memory>

#include "slice/backbone_experts.h"
#include "slice/expert_digest.h"
#include "slice/gguf_slice.h"

namespace essaim::backbone {
namespace {

std::string range_text(const proto::Holding& h) {
  return h.expert_count == 1 ? std::to_string(h.first_expert)
                             : std::to_string(h.first_expert) + "-" + std::to_string(h.first_expert + h.expert_count - 1);
}

}  // namespace

// A backbone file carries every expert's digest (slice/backbone_experts.h): nothing to hash.
Result<PeerCheck> recorded_weights_check(const GgufFile& file) {
  ESSAIM_ASSIGN_OR_RETURN(BackboneExperts recorded, read_backbone_experts(file));
  auto st = std::make_shared<const BackboneExperts>(std::move(recorded));
  return PeerCheck([st](const proto::Hello& peer) -> std::optional<proto::Refuse> {
    for (const proto::Holding& h : peer.holdings) {
      const int64_t li = st->layer_index(h.layer);
      if (li < 0 || uint64_t(h.first_expert) + h.expert_count > st->expert_count) continue;
      const std::vector<Sha256Digest>& d = st->digests[size_t(li)];
      const Sha256Digest mine = holding_digest(std::span(d).subspan(h.first_expert, h.expert_count));
      if (mine != h.sha256) {
        return proto::Refuse{
            proto::RefuseReason::WEIGHTS,
            "the slice holding experts " + range_text(h) + " of layer " + std::to_string(h.layer) +
                " has other weights than this backbone's model (content digest " + digest_hex(h.sha256).substr(0, 16) +
                "..., the backbone file records " + digest_hex(mine).substr(0, 16) +
                "...): it was cut from another model of the same shape"};
      }
    }
    return std::nullopt;
  });
}

Result<PeerCheck> weights_check(const GgufFile& file, std::string cache_path) {
  if (is_backbone_file(file)) return recorded_weights_check(file);
  struct State {
    MoeLayout layout;
    std::unique_ptr<ExpertDigestCache> cache;
  };
  auto st = std::make_shared<State>();
  ESSAIM_ASSIGN_OR_RETURN(st->layout, moe_layout(file));
  ESSAIM_ASSIGN_OR_RETURN(st->cache, ExpertDigestCache::open(file, st->layout, std::move(cache_path)));
  return PeerCheck([st](const proto::Hello& peer) -> std::optional<proto::Refuse> {
    for (const proto::Holding& h : peer.holdings) {
      if (st->layout.find_layer(h.layer) == nullptr ||
          uint64_t(h.first_expert) + h.expert_count > st->layout.expert_count)
        continue;
      Result<Sha256Digest> mine = st->cache->holding(h.layer, h.first_expert, h.expert_count);
      if (!mine) return proto::Refuse{proto::RefuseReason::WEIGHTS, mine.status().message()};
      if (*mine != h.sha256) {
        return proto::Refuse{
            proto::RefuseReason::WEIGHTS,
            "the slice holding experts " + range_text(h) + " of layer " + std::to_string(h.layer) +
                " has other weights than this backbone's model (content digest " + digest_hex(h.sha256).substr(0, 16) +
                "..., this backbone's " + digest_hex(*mine).substr(0, 16) +
                "...): it was cut from another model of the same shape; cut it again from the backbone's file"};
      }
    }
    return std::nullopt;
  });
}

PeerCheck both_checks(PeerCheck first, PeerCheck second) {
  if (!first) return second;
  if (!second) return first;
  return [a = std::move(first), b = std::move(second)](const proto::Hello& h) -> std::optional<proto::Refuse> {
    if (std::optional<proto::Refuse> r = a(h)) return r;
    return b(h);
  };
}

}  // namespace essaim::backbone
