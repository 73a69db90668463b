// Internals of Coordinator shared by its .cpp files (the API, the downloads, the dashboard). Not an API.
#pragma once

#include <boost/asio/thread_pool.hpp>
#include <nlohmann/json.hpp>

#include <mutex>

#include "coord/coordinator.h"

namespace essaim::coord {

struct Caller {
  enum Kind { NONE, ADMIN, NODE } kind = NONE;
  NodeRow node;  // for NODE
};

struct Coordinator::Impl {
  const Catalogue& cat;
  std::unique_ptr<Store> store;
  CoordinatorConfig cfg;
  boost::asio::thread_pool pool;
  std::once_flag stopped;
  std::atomic<uint64_t> requests{0}, unauthorized{0}, bytes_served{0}, downloads{0}, store_errors{0};

  Impl(const Catalogue& c, std::unique_ptr<Store> s, CoordinatorConfig config)
      : cat(c), store(std::move(s)), cfg(std::move(config)), pool(size_t(std::max(1, cfg.threads))) {}

  int64_t now() const;
  Caller authenticate(const std::string& authorization);
  net::HttpReply route(const net::HttpRequestView& req);
  // GET /slices/NAME: answers through `out` (a stream), from the pool.
  void download(const net::HttpRequestView& req, const std::string& name, std::shared_ptr<net::HttpResponder> out);
  nlohmann::json dashboard_json();
};

net::HttpReply json_reply(int status, const nlohmann::json& body);
net::HttpReply error(int status, const std::string& message, const std::string& code);
std::string dashboard_html();

}  // namespace essaim::coord
