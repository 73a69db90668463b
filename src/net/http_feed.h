// Feeding received bytes to Beast's HTTP request parser, for every essaim listener that reads HTTP (the
// HttpServer of serve and the coordinator, the relay's upgrade port). Beast throws from inside its parser
// (std::length_error for a field over 64 KiB, which a chunked body's trailer can hold), and from inside
// Beast's asynchronous read the exception escapes the I/O thread and ends the process; here the parser is
// called directly, inside a try, and a throw is an error value. The caller reads into a buffer whose
// max_size is its header limit: what the parser needs whole (the head, a chunk line, the trailer) is
// bounded by it, and a full buffer that still needs more is refused as too large.
//
//   beast::flat_buffer buffer(limits.max_header_bytes);
//   HttpFeed f = feed_http_request(parser, buffer, /*stop_at_head=*/true);
//   switch (f.stop) { case HttpFeedStop::NEED_MORE: read more into buffer (full: 431) ... }
#pragma once

#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include <string>

namespace essaim::net {

enum class HttpFeedStop : uint8_t {
  NEED_MORE,  // every buffered byte is used: read more (or, the buffer being full, refuse with 431)
  HEAD,       // the head has just been parsed (only when asked to stop there)
  DONE,       // the request is complete
  ERROR,      // `ec` says what (body_limit: 413; header_limit: 431; anything else: 400), or `thrown` does
};

struct HttpFeed {
  HttpFeedStop stop = HttpFeedStop::NEED_MORE;
  boost::beast::error_code ec;
  std::string thrown;  // what() of an exception from the parser, when it threw
};

// Parses what `buffer` holds (consuming it). With `stop_at_head`, returns HEAD once when the head completes.
HttpFeed feed_http_request(boost::beast::http::request_parser<boost::beast::http::string_body>& parser,
                           boost::beast::flat_buffer& buffer, bool stop_at_head);

// True when the parser needs more bytes but the buffer has no room for them.
inline bool http_buffer_full(const boost::beast::flat_buffer& buffer) { return buffer.size() >= buffer.max_size(); }

}  // namespace essaim::net
