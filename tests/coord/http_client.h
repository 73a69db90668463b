// A blocking HTTP/1.1 client for the coordinator tests (Boost.Beast), one connection per request.
//
//   Reply r = request(port, "GET", "/api/whoami", "", token);   // r.status, r.headers, r.body, r.j()
#pragma once

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace essaim::coord::testing {

namespace beast = boost::beast;
namespace http = beast::http;
using json = nlohmann::json;

// status 0: no answer (connection refused or broken).
struct Reply {
  int status = 0;
  std::map<std::string, std::string> headers;
  std::string body;
  json j() const { return json::parse(body, nullptr, false); }
};

inline Reply request(uint16_t port, const std::string& method, const std::string& target, const std::string& body = "",
              const std::string& token = "", const std::vector<std::pair<std::string, std::string>>& extra = {}) {
  boost::asio::io_context ioc;
  beast::tcp_stream s(ioc);
  beast::error_code ec;
  s.connect(boost::asio::ip::tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), port), ec);
  if (ec) return {};
  s.expires_after(std::chrono::seconds(30));
  http::request<http::string_body> req(http::string_to_verb(method), target, 11);
  req.set(http::field::host, "127.0.0.1");
  if (!token.empty()) req.set(http::field::authorization, "Bearer " + token);
  for (const auto& [k, v] : extra) req.set(k, v);
  req.body() = body;
  if (!body.empty()) req.set(http::field::content_type, "application/json");
  req.prepare_payload();
  http::write(s, req, ec);
  if (ec) return {};
  beast::flat_buffer buf;
  http::response_parser<http::string_body> p;
  p.body_limit(uint64_t(1) << 32);
  http::read(s, buf, p, ec);
  Reply r;
  if (ec) return r;
  r.status = p.get().result_int();
  for (const auto& f : p.get()) r.headers[std::string(f.name_string())] = std::string(f.value());
  r.body = p.get().body();
  return r;
}

}  // namespace essaim::coord::testing
