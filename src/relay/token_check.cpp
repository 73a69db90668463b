#include "relay/token_check.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "net/tcp.h"
#include "relay/preamble.h"

namespace essaim::relay {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

Result<std::unique_ptr<FileTokenChecker>> FileTokenChecker::load(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::error("cannot read token file " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  Result<std::unique_ptr<FileTokenChecker>> r = parse(ss.str());
  if (!r) return Status::error(path + ": " + r.status().message());
  return r;
}

Result<std::unique_ptr<FileTokenChecker>> FileTokenChecker::parse(const std::string& text) {
  auto c = std::unique_ptr<FileTokenChecker>(new FileTokenChecker());
  std::map<std::string, int> node_line;
  std::istringstream in(text);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (size_t hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream words(line);
    std::string node, token, extra;
    if (!(words >> node)) continue;
    if (!(words >> token) || (words >> extra)) return Status::error("line " + std::to_string(n) + ": expected 'NODE_ID TOKEN'");
    if (!valid_node_id(node)) return Status::error("line " + std::to_string(n) + ": node id '" + node + "' is not [A-Za-z0-9._~-]{1,128}");
    if (!valid_token(token)) return Status::error("line " + std::to_string(n) + ": the token is not [A-Za-z0-9._~-]{1,256}");
    if (c->node_by_token_.count(token)) return Status::error("line " + std::to_string(n) + ": this token is listed twice");
    if (auto [it, fresh] = node_line.emplace(node, n); !fresh) {
      return Status::error("line " + std::to_string(n) + ": node " + node + " already has a token (line " + std::to_string(it->second) + ")");
    }
    c->node_by_token_.emplace(token, node);
  }
  return c;
}

TokenVerdict FileTokenChecker::check(const std::string& token) {
  auto it = node_by_token_.find(token);
  if (it == node_by_token_.end()) return {TokenVerdict::Kind::REFUSED, "", "unknown token"};
  return {TokenVerdict::Kind::ACCEPTED, it->second, ""};
}

Result<std::unique_ptr<CoordinatorTokenChecker>> CoordinatorTokenChecker::create(const std::string& url,
                                                                                   std::chrono::milliseconds cache_ttl,
                                                                                   std::chrono::milliseconds timeout) {
  std::string_view rest = url;
  if (!rest.starts_with("http://")) {
    return Status::error("--coordinator " + url + ": give http://HOST:PORT (https to the coordinator is not supported yet)");
  }
  rest.remove_prefix(7);
  while (rest.ends_with("/")) rest.remove_suffix(1);
  net::NetResult<std::pair<std::string, uint16_t>> hp = net::parse_host_port(rest);
  if (!hp) return Status::error("--coordinator " + url + ": " + hp.error().message);
  auto c = std::unique_ptr<CoordinatorTokenChecker>(new CoordinatorTokenChecker());
  c->host_ = hp->first, c->port_ = hp->second, c->ttl_ = cache_ttl, c->timeout_ = timeout;
  return c;
}

TokenVerdict CoordinatorTokenChecker::check(const std::string& token) {
  const auto now = std::chrono::steady_clock::now();
  {
    std::lock_guard lk(mu_);
    auto it = cache_.find(token);
    if (it != cache_.end() && now - it->second.at < ttl_) return it->second.verdict;
  }
  TokenVerdict v = ask(token);
  if (v.kind != TokenVerdict::Kind::UNAVAILABLE) {
    std::lock_guard lk(mu_);
    if (cache_.size() > 4096) cache_.clear();  // a bound on what unknown tokens can make us hold
    cache_[token] = {v, now};
  }
  return v;
}

TokenVerdict CoordinatorTokenChecker::ask(const std::string& token) {
  asio::io_context ioc;
  beast::tcp_stream stream(ioc);
  asio::ip::tcp::resolver resolver(ioc);
  beast::flat_buffer buf;
  http::request<http::empty_body> req{http::verb::get, "/api/whoami", 11};
  req.set(http::field::host, host_ + ":" + std::to_string(port_));
  req.set(http::field::authorization, "Bearer " + token);
  http::response_parser<http::string_body> parser;
  parser.body_limit(64 << 10);
  beast::error_code result = asio::error::timed_out;
  stream.expires_after(timeout_);
  resolver.async_resolve(host_, std::to_string(port_), [&](beast::error_code ec, asio::ip::tcp::resolver::results_type eps) {
    if (ec) return void(result = ec);
    stream.async_connect(eps, [&](beast::error_code ec2, const asio::ip::tcp::endpoint&) {
      if (ec2) return void(result = ec2);
      http::async_write(stream, req, [&](beast::error_code ec3, size_t) {
        if (ec3) return void(result = ec3);
        http::async_read(stream, buf, parser, [&](beast::error_code ec4, size_t) { result = ec4; });
      });
    });
  });
  ioc.run_for(timeout_ + std::chrono::milliseconds(500));
  const std::string where = "coordinator " + host_ + ":" + std::to_string(port_);
  if (result) return {TokenVerdict::Kind::UNAVAILABLE, "", where + " unreachable: " + result.message()};
  const auto& res = parser.get();
  const int status = res.result_int();
  if (status == 401 || status == 403) return {TokenVerdict::Kind::REFUSED, "", "token refused by the coordinator"};
  if (status != 200) return {TokenVerdict::Kind::UNAVAILABLE, "", where + " answered HTTP " + std::to_string(status)};
  nlohmann::json j = nlohmann::json::parse(res.body(), nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("node_id") || !j["node_id"].is_string()) {
    return {TokenVerdict::Kind::UNAVAILABLE, "", where + ": /api/whoami answer has no node_id"};
  }
  std::string node = j["node_id"].get<std::string>();
  if (!valid_node_id(node)) return {TokenVerdict::Kind::UNAVAILABLE, "", where + ": /api/whoami gave a malformed node id"};
  return {TokenVerdict::Kind::ACCEPTED, node, ""};
}

}  // namespace essaim::relay
