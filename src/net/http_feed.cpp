#include "net/http_feed.h"

#include <boost/beast/http/error.hpp>

#include <exception>

namespace essaim::net {

namespace http = boost::beast::http;

HttpFeed feed_http_request(http::request_parser<http::string_body>& parser, boost::beast::flat_buffer& buffer,
                           bool stop_at_head) {
  HttpFeed f;
  while (!parser.is_done()) {
    if (buffer.size() == 0) return f;  // NEED_MORE
    const bool head_before = parser.is_header_done();
    size_t used = 0;
    try {
      used = parser.put(buffer.data(), f.ec);
    } catch (const std::exception& e) {
      f.stop = HttpFeedStop::ERROR;
      f.thrown = e.what();
      return f;
    }
    buffer.consume(used);
    if (f.ec == http::error::need_more) {
      f.ec = {};
      return f;  // NEED_MORE
    }
    if (f.ec) {
      f.stop = HttpFeedStop::ERROR;
      return f;
    }
    if (stop_at_head && !head_before && parser.is_header_done()) {
      f.stop = HttpFeedStop::HEAD;
      return f;
    }
  }
  f.stop = HttpFeedStop::DONE;
  return f;
}

}  // namespace essaim::net
