// GET /slices/NAME: the file's bytes, whole or one Range, streamed in chunks with backpressure (the next
// chunk is read only once the previous one has gone to the socket), so a download of any size holds one
// chunk of memory. The name must be exactly a catalogue name: no path is ever built from client text.
#include <sys/stat.h>

#include <boost/asio/post.hpp>

#include <cstdio>
#include <filesystem>
#include <mutex>

#include "coord/api_parse.h"
#include "coord/coordinator_impl.h"

namespace essaim::coord {
namespace {

struct Download {
  std::mutex mu;
  bool done = false;
  std::FILE* f = nullptr;
  uint64_t left = 0;
  std::shared_ptr<net::HttpResponder> out;
  ~Download() {
    if (f) std::fclose(f);
  }
};

}  // namespace

void Coordinator::Impl::download(const net::HttpRequestView& req, const std::string& name,
                                 std::shared_ptr<net::HttpResponder> out) {
  ++requests;
  const Caller who = authenticate(req.authorization);
  if (who.kind == Caller::NONE) {
    ++unauthorized;
    return out->reply(error(401, "a valid token is needed (Authorization: Bearer <token>)", "unauthorized"));
  }
  const std::optional<size_t> idx = cat.find_name(name);
  if (!idx) return out->reply(error(404, "no slice named '" + name.substr(0, 255) + "' in the catalogue", "not_found"));
  const CatalogueSlice& s = cat.slices[*idx];
  auto d = std::make_shared<Download>();
  const std::string path = (std::filesystem::path(cfg.slices_dir) / s.name).string();
  d->f = std::fopen(path.c_str(), "rb");
  struct stat st{};
  if (!d->f || ::fstat(fileno(d->f), &st) != 0) {
    return out->reply(error(500, "slice " + s.name + " cannot be read on the coordinator", "slice_unreadable"));
  }
  const uint64_t total = uint64_t(st.st_size);
  if (total != uint64_t(s.bytes)) {
    return out->reply(error(500, "slice " + s.name + " changed on the coordinator's disk", "slice_changed"));
  }
  const ByteRange r = parse_range_header(req.range, total);
  net::HttpReply head{.status = 200, .content_type = "application/octet-stream", .body = {},
                      .headers = {{"Accept-Ranges", "bytes"}, {"X-Essaim-Sha256", s.sha256}}};
  uint64_t first = 0, count = total;
  switch (r.kind) {
    case ByteRange::MALFORMED:
      return out->reply(error(400, "malformed Range header (one range, bytes=a-b, bytes=a- or bytes=-n)", "bad_range"));
    case ByteRange::UNSATISFIABLE: {
      net::HttpReply e = error(416, "the range lies outside the slice's " + std::to_string(total) + " bytes", "range_not_satisfiable");
      e.headers.push_back({"Content-Range", "bytes */" + std::to_string(total)});
      return out->reply(std::move(e));
    }
    case ByteRange::PARTIAL:
      head.status = 206;
      first = r.first;
      count = r.last - r.first + 1;
      head.headers.push_back({"Content-Range", "bytes " + std::to_string(r.first) + "-" + std::to_string(r.last) + "/" +
                                                   std::to_string(total)});
      break;
    case ByteRange::WHOLE:
      break;
  }
  head.headers.push_back({"Content-Length", std::to_string(count)});
  if (first > 0 && std::fseek(d->f, long(first), SEEK_SET) != 0) {
    return out->reply(error(500, "slice " + s.name + " cannot be read on the coordinator", "slice_unreadable"));
  }
  ++downloads;
  d->left = count;
  d->out = out;
  out->stream_begin(std::move(head));
  // A few chunks in flight (so reading the next overlaps writing the last), each next one read once an
  // earlier one has gone to the socket. Read and hand-over happen under the download's lock: chunks reach
  // the connection in file order whichever pool thread reads them.
  auto pump = std::make_shared<std::function<void()>>();
  *pump = [this, d, weak = std::weak_ptr<std::function<void()>>(pump)] {
    auto self = weak.lock();
    if (!self) return;
    std::lock_guard<std::mutex> lock(d->mu);
    if (d->done) return;
    if (d->left == 0) {
      d->done = true;
      return d->out->stream_end();
    }
    std::string chunk(size_t(std::min<uint64_t>(d->left, kDownloadChunkBytes)), '\0');
    const size_t n = std::fread(chunk.data(), 1, chunk.size(), d->f);
    if (n != chunk.size()) {  // short read (the file shrank): the client sees a short body and retries
      d->done = true;
      return d->out->stream_end();
    }
    d->left -= n;
    bytes_served += n;
    d->out->stream_write_then(std::move(chunk), [this, self] { boost::asio::post(pool, [self] { (*self)(); }); });
  };
  for (int i = 0; i < kDownloadChunksInFlight; ++i) (*pump)();
}

}  // namespace essaim::coord
