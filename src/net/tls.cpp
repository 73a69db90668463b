#include "net/tls.h"

#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include <boost/asio/ssl/error.hpp>
#include <boost/asio/ssl/host_name_verification.hpp>

namespace essaim::net {

NetResult<std::unique_ptr<ssl::context>> tls_server_context(const ServerTls& files) {
  auto ctx = std::make_unique<ssl::context>(ssl::context::tls_server);
  boost::system::error_code ec;
  ctx->use_certificate_chain_file(files.cert_file, ec);
  if (ec) return net_error(NetErrorKind::IO, "cannot load certificate " + files.cert_file + ": " + ec.message());
  ctx->use_private_key_file(files.key_file, ssl::context::pem, ec);
  if (ec) return net_error(NetErrorKind::IO, "cannot load private key " + files.key_file + ": " + ec.message());
  return ctx;
}

NetResult<std::shared_ptr<ssl::context>> tls_client_context(const std::string& ca_file) {
  auto ctx = std::make_shared<ssl::context>(ssl::context::tls_client);
  boost::system::error_code ec;
  ctx->set_default_verify_paths(ec);  // OpenSSL's defaults, which read SSL_CERT_FILE / SSL_CERT_DIR
  if (ec) return net_error(NetErrorKind::IO, "cannot load the system trust store: " + ec.message());
  if (!ca_file.empty()) {
    ctx->load_verify_file(ca_file, ec);
    if (ec) return net_error(NetErrorKind::IO, "cannot load CA file " + ca_file + ": " + ec.message());
  }
  return ctx;
}

bool TlsPeerVerifier::operator()(bool preverified, ssl::verify_context& ctx) const {
  X509_STORE_CTX* store = ctx.native_handle();
  if (!preverified) {
    const int err = X509_STORE_CTX_get_error(store);
    if (check && check->failure.empty()) check->failure = X509_verify_cert_error_string(err);
    return false;
  }
  // The chain is checked from the root down; the host name only on the peer's own certificate.
  if (X509_STORE_CTX_get_error_depth(store) > 0) return true;
  const bool named = ssl::host_name_verification(host)(preverified, ctx);
  if (!named && check && check->failure.empty()) check->failure = "the certificate does not name host " + host;
  return named;
}

NetError tls_handshake_error(const std::string& where, const boost::system::error_code& ec, const TlsPeerCheck& check) {
  std::string why = ec.message();
  if (!check.failure.empty()) why = "certificate verify failed: " + check.failure;
  return net_error(NetErrorKind::IO, "TLS handshake with " + where + " failed: " + why);
}

}  // namespace essaim::net
