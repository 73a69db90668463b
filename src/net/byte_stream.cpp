#include "net/byte_stream.h"

namespace essaim::net {

std::string_view net_error_kind_name(NetErrorKind k) {
  switch (k) {
    case NetErrorKind::TIMEOUT: return "timeout";
    case NetErrorKind::CLOSED: return "connection closed";
    case NetErrorKind::IO: return "i/o error";
    case NetErrorKind::PROTOCOL: return "protocol error";
    case NetErrorKind::REFUSED: return "handshake refused";
    case NetErrorKind::TOO_LARGE: return "message too large";
    case NetErrorKind::COUNT: break;
  }
  return "?";
}

Status NetError::status() const { return Status::error(std::string(net_error_kind_name(kind)) + ": " + message); }

}  // namespace essaim::net
