#include "worker/relay_serving.h"

#include <signal.h>
#include <unistd.h>

namespace essaim::worker {

void RelayRefusal::set(std::string why) {
  std::lock_guard lock(mu_);
  if (why_.empty()) why_ = std::move(why);
}

std::string RelayRefusal::why() const {
  std::lock_guard lock(mu_);
  return why_;
}

Result<RelayServing> serve_through_relay(const RelayConfig& config, std::shared_ptr<RelayRefusal> refusal) {
  net::NetResult<net::WsUrl> url = net::parse_ws_url(config.relay);
  if (!url) return Status::error("--relay " + config.relay + ": " + url.error().message);
  relay::RelayAcceptor::Options o{.relay = *url, .token = config.token, .build = config.build,
                                  .ws = {.limits = {}, .ca_file = config.ca_file},
                                  .idle_connections = config.idle_connections};
  o.log = config.log;
  o.on_refused = [refusal](const std::string& why) {
    refusal->set(why);
    ::kill(::getpid(), SIGTERM);
  };
  RelayServing s{.acceptor = std::make_unique<relay::RelayAcceptor>(std::move(o)), .where = url->text()};
  s.where.resize(s.where.size() - url->path.size());  // "wss://host:port": the port is the relay's
  return s;
}

}  // namespace essaim::worker
