// TLS as every essaim listener and client does it (OpenSSL through Asio). Listeners (the relay's wss://, the
// coordinator's https://) load a PEM chain and key into a server context. Clients (the wss:// relay client,
// the https:// HTTP client) verify the peer: its certificate is verified against the system trust store (OpenSSL's default paths, so SSL_CERT_FILE
// and SSL_CERT_DIR are honoured) plus an optional PEM file (`--ca-file`), the host name is checked against
// the certificate and sent as SNI, and a failed handshake is explained with the host and OpenSSL's reason.
//
//   NetResult<std::shared_ptr<ssl::context>> ctx = tls_client_context(ca_file);
//   beast::ssl_stream<beast::tcp_stream> s(ioc, **ctx);
//   auto check = std::make_shared<TlsPeerCheck>();
//   NetStatus ok = tls_client_setup(s, host, check);     // before the handshake
//   ... async_handshake(ssl::stream_base::client, ...) fails with ec:
//   return tls_handshake_error("relay.example.org:443", ec, *check);  // "...: certificate verify failed (...)"
#pragma once

#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/stream_base.hpp>
#include <boost/asio/ssl/verify_context.hpp>
#include <boost/system/error_code.hpp>
#include <memory>
#include <string>

#include "net/byte_stream.h"

namespace essaim::net {

namespace ssl = boost::asio::ssl;

struct ServerTls {
  std::string cert_file;  // PEM chain
  std::string key_file;   // PEM private key
};
// A server context with that chain and key; errors name the file.
NetResult<std::unique_ptr<ssl::context>> tls_server_context(const ServerTls& files);

// A client context trusting the system store plus `ca_file` (PEM; empty: none). Errors name the file.
NetResult<std::shared_ptr<ssl::context>> tls_client_context(const std::string& ca_file);

// What the verification of the peer's certificate found: the first failure, in words (empty when none).
struct TlsPeerCheck {
  std::string failure;
};

// The verify callback: OpenSSL's chain verdict, then the host name (RFC 6125 via Asio), the first failure
// recorded in `check`.
struct TlsPeerVerifier {
  std::string host;
  std::shared_ptr<TlsPeerCheck> check;
  bool operator()(bool preverified, ssl::verify_context& ctx) const;
};

// SNI, peer verification and the host-name check on a client stream (asio::ssl::stream or beast::ssl_stream).
template <class TlsStream>
NetStatus tls_client_setup(TlsStream& stream, const std::string& host, std::shared_ptr<TlsPeerCheck> check) {
  if (!SSL_set_tlsext_host_name(stream.native_handle(), host.c_str())) {
    return net_error(NetErrorKind::IO, host + ": cannot set the TLS server name");
  }
  stream.set_verify_mode(ssl::verify_peer);
  stream.set_verify_callback(TlsPeerVerifier{host, std::move(check)});
  return {};
}

// "TLS handshake with WHERE failed: REASON", REASON the verification's failure when there was one.
NetError tls_handshake_error(const std::string& where, const boost::system::error_code& ec, const TlsPeerCheck& check);

}  // namespace essaim::net
