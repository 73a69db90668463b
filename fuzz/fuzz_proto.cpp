// libFuzzer target for the expert protocol: any byte stream, cut into any chunks, must decode into frames
// and messages or into typed errors (never a crash, an abort or an attacker-sized allocation), and every
// message that decodes must re-encode to exactly the bytes it came from (the encoding is canonical).
//
//   build-fuzz/fuzz/fuzz_proto -max_total_time=60 build-fuzz/corpus/fuzz_proto
//
// Input layout: byte 0 picks the chunk sizes fed to the incremental decoder; the rest is the stream.
// The same bytes are also decoded as one message payload of type (byte 1), so that message decoders are
// reached even by inputs whose frame headers are wrong.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>

#include "proto/frame.h"
#include "proto/messages.h"

namespace {

using namespace essaim::proto;

constexpr uint64_t kLimit = 1 << 20;

void check_message(FrameType type, std::span<const uint8_t> payload) {
  ProtoResult<Message> m = decode_message(type, payload);
  if (!m) {
    if (m.error().message.empty()) std::abort();  // every refusal says why
    return;
  }
  // A HELLO of a foreign version is decoded only up to its version (the rest is that version's business).
  if (const auto* h = std::get_if<Hello>(&*m); h && h->version != kProtocolVersion) return;
  std::vector<uint8_t> again = encode_message(*m);
  if (again.size() != kFrameHeaderBytes + payload.size() ||
      (!payload.empty() && std::memcmp(again.data() + kFrameHeaderBytes, payload.data(), payload.size()) != 0)) {
    std::abort();  // decode and encode disagree on the layout
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const size_t chunk = 1 + data[0] % 64;
  std::span<const uint8_t> stream(data + 1, size - 1);

  if (std::optional<FrameType> t = frame_type_from_byte(data[1])) check_message(*t, stream.subspan(1));

  FrameDecoder dec(kLimit);
  while (!stream.empty() && !dec.error()) {
    std::span<const uint8_t> piece = stream.first(std::min(chunk, stream.size()));
    size_t used = dec.feed(piece);
    if (used > piece.size()) std::abort();
    stream = stream.subspan(used);
    if (dec.ready()) {
      Frame f = dec.take();
      if (f.payload.size() > kLimit) std::abort();
      check_message(f.type, f.payload);
    } else if (used == 0 && !dec.error()) {
      std::abort();  // a decoder that neither progresses nor fails would hang a connection
    }
  }
  return 0;
}
