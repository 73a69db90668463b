#include "relay/token_check.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "relay/preamble.h"

namespace essaim::relay {

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
                                                                                   const Options& options) {
  Result<net::HttpUrl> parsed = net::parse_http_url(url);
  if (!parsed) return Status::error("--coordinator: " + parsed.status().message());
  ESSAIM_RETURN_IF_ERROR(net::check_plain_http(*parsed, options.insecure_http, "--coordinator"));
  auto c = std::unique_ptr<CoordinatorTokenChecker>(new CoordinatorTokenChecker());
  c->url_ = std::move(*parsed);
  c->url_.ca_file = options.ca_file;
  c->options_ = options;
  return c;
}

TokenVerdict CoordinatorTokenChecker::check(const std::string& token) {
  const auto now = std::chrono::steady_clock::now();
  {
    std::lock_guard lk(mu_);
    auto it = cache_.find(token);
    if (it != cache_.end() && now - it->second.at < options_.cache_ttl) return it->second.verdict;
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
  const net::HttpCall call{.method = "GET", .target = "/api/whoami", .bearer = token, .body = {}, .headers = {},
                           .deadline = options_.timeout, .read_timeout = options_.timeout, .max_body_bytes = 64 << 10};
  Result<net::HttpAnswer> a = net::http_call(url_, call);
  const std::string where = "coordinator " + url_.text();
  if (!a) return {TokenVerdict::Kind::UNAVAILABLE, "", where + " unreachable: " + a.status().message()};
  if (a->status == 401 || a->status == 403) return {TokenVerdict::Kind::REFUSED, "", "token refused by the coordinator"};
  if (a->status != 200) return {TokenVerdict::Kind::UNAVAILABLE, "", where + " answered HTTP " + std::to_string(a->status)};
  nlohmann::json j = nlohmann::json::parse(a->body, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("node_id") || !j["node_id"].is_string()) {
    return {TokenVerdict::Kind::UNAVAILABLE, "", where + ": /api/whoami answer has no node_id"};
  }
  std::string node = j["node_id"].get<std::string>();
  if (!valid_node_id(node)) return {TokenVerdict::Kind::UNAVAILABLE, "", where + ": /api/whoami gave a malformed node id"};
  return {TokenVerdict::Kind::ACCEPTED, node, ""};
}

}  // namespace essaim::relay
