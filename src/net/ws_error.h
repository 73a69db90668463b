// Boost error codes of a WebSocket stream as essaim's NetError, shared by the client streams
// (net/websocket.cpp) and the server sessions (net/ws_listener.cpp) so both report a failure alike.
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <boost/system/error_code.hpp>

#include <string>

#include "net/byte_stream.h"

namespace essaim::net {

// TIMEOUT for Beast's timeouts; CLOSED for a close handshake, EOF, reset, broken pipe or a cancelled
// operation; TOO_LARGE for a message over the read limit; PROTOCOL for any other WebSocket error; else IO.
// The message reads "<who>: <what>: <reason>".
NetError ws_error(const boost::system::error_code& ec, const std::string& who, const char* what);

// "1.2.3.4:5678", "[::1]:5678".
std::string ws_endpoint_text(const boost::asio::ip::tcp::endpoint& ep);

}  // namespace essaim::net
