// libFuzzer target for the relay's first message (docs/relay.md): any bytes decode into a preamble or an
// error that says why (never a crash or an attacker-sized allocation), and every preamble that decodes
// re-encodes to exactly the bytes it came from (the encoding is canonical). The same bytes are also read
// as a token file and as a ws:// URL, the relay's other untrusted inputs.
//
//   build-fuzz/fuzz/fuzz_relay_preamble -max_total_time=60 fuzz/corpus/fuzz_relay_preamble
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>

#include "net/websocket.h"
#include "relay/preamble.h"
#include "relay/relay_client.h"
#include "relay/token_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace essaim;
  std::span<const uint8_t> bytes(data, size);
  essaim::Result<relay::Preamble> p = relay::decode_preamble(bytes);
  if (p) {
    std::vector<uint8_t> again = relay::encode_preamble(*p);
    if (again.size() != size || std::memcmp(again.data(), data, size) != 0) std::abort();
  } else if (p.status().message().empty()) {
    std::abort();
  }
  if (size <= 4096) {
    const std::string text(reinterpret_cast<const char*>(data), size);
    (void)relay::FileTokenChecker::parse(text);
    net::NetResult<net::WsUrl> u = net::parse_ws_url(text);
    if (u && (u->host.empty() || u->path.empty() || u->path[0] != '/')) std::abort();
    if (u) (void)relay::node_id_of_url(*u);
  }
  return 0;
}
