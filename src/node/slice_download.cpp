// The whole file is hashed after the last byte arrives rather than on the fly: a resumed download would
// otherwise have to trust (or re-read) the part written before the restart, and re-reading once at the
// end costs one pass at disk speed for every byte, which is the check we want anyway.
#include "node/slice_download.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <thread>

#include "core/progress.h"
#include "slice/model_identity.h"

namespace essaim::node {
namespace {

namespace fs = std::filesystem;

std::string errno_text() { return std::strerror(errno); }

std::optional<uint64_t> file_size(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return uint64_t(st.st_size);
}

// "bytes a-b/total" -> (a, b, total).
bool parse_content_range(const std::string& v, uint64_t& a, uint64_t& b, uint64_t& total) {
  unsigned long long x = 0, y = 0, t = 0;
  char tail = 0;
  if (std::sscanf(v.c_str(), "bytes %llu-%llu/%llu%c", &x, &y, &t, &tail) != 3) return false;
  a = x;
  b = y;
  total = t;
  return a <= b && b < total;
}

}  // namespace

Result<std::string> file_sha256_hex(const std::string& path) {
  ESSAIM_ASSIGN_OR_RETURN(Sha256Digest d, sha256_file(path));
  return digest_hex(d);
}

Result<std::vector<uint8_t>> fetch_byte_range(const net::HttpUrl& coordinator, const std::string& token,
                                              const std::string& target, uint64_t offset, uint64_t length,
                                              std::chrono::milliseconds read_timeout) {
  if (length == 0 || length > (1ull << 30)) return Status::error("a range of " + std::to_string(length) + " bytes");
  if (offset > UINT64_MAX - length) return Status::error("a range past 2^64");
  const uint64_t last = offset + length - 1;
  net::HttpCall call{.method = "GET", .target = target, .bearer = token, .body = {}, .headers = {}};
  call.read_timeout = read_timeout;
  call.headers.emplace_back("Range", "bytes=" + std::to_string(offset) + "-" + std::to_string(last));
  std::vector<uint8_t> out;
  Status st = net::http_stream(
      coordinator, call,
      [&](const net::HttpAnswer& head) -> Status {
        if (head.status != 206) return Status::error("the coordinator answered " + std::to_string(head.status) + " to a Range request");
        uint64_t a = 0, b = 0, total = 0;
        const std::optional<std::string> cr = head.header("content-range");
        if (!cr || !parse_content_range(*cr, a, b, total) || a != offset || b != last)
          return Status::error("206 with Content-Range '" + cr.value_or("") + "', asked for bytes " +
                               std::to_string(offset) + "-" + std::to_string(last));
        out.reserve(length);
        return Status::ok();
      },
      [&](std::span<const char> bytes) -> Status {
        if (out.size() + bytes.size() > length) return Status::error("the body is longer than the range");
        out.insert(out.end(), bytes.begin(), bytes.end());
        return Status::ok();
      });
  ESSAIM_RETURN_IF_ERROR(st.with_context("reading " + target));
  if (out.size() != length)
    return Status::error("reading " + target + ": got " + std::to_string(out.size()) + " of " + std::to_string(length) + " bytes");
  return out;
}

namespace {

// A complete copy already at `path` whose bytes hash to the catalogue's digest.
bool verified_copy(const std::string& path, const SliceOffer& offer) {
  const std::optional<uint64_t> have = file_size(path);
  if (!have || *have != offer.bytes) return false;
  Result<std::string> sha = file_sha256_hex(path);
  return sha && *sha == offer.sha256;
}

// The .part file opened for appending at `offset` (cut there).
Result<int> open_part(const std::string& part, uint64_t offset) {
  const int fd = ::open(part.c_str(), O_WRONLY | O_CREAT, 0644);
  if (fd < 0) return Status::error("cannot write " + part + ": " + errno_text());
  if (::ftruncate(fd, off_t(offset)) != 0 || ::lseek(fd, off_t(offset), SEEK_SET) < 0) {
    ::close(fd);
    return Status::error("cannot prepare " + part + ": " + errno_text());
  }
  return fd;
}

// The answer's head for a request of the slice from `offset`: a refusal (Status::refusal: no retry will change
// it) for auth, an unknown slice or another file than the catalogue's; a 200 to a Range request starts over
// (offset and expected reset, the part file cut).
Status check_slice_head(const net::HttpAnswer& head, const SliceOffer& offer, int fd, const std::string& part,
                        uint64_t& offset, uint64_t& expected) {
  if (head.status == 401 || head.status == 403 || head.status == 404)
    return Status::refusal("the coordinator answered " + std::to_string(head.status) +
                           (head.status == 404 ? " (no such slice)" : " (check --token)"));
  if (head.status == 200 && offset > 0) {  // the server ignored the Range: start over
    if (::ftruncate(fd, 0) != 0 || ::lseek(fd, 0, SEEK_SET) < 0) return Status::error("cannot truncate " + part);
    offset = 0;
    expected = offer.bytes;
  } else if (head.status == 206) {
    uint64_t a = 0, b = 0, total = 0;
    const std::optional<std::string> cr = head.header("content-range");
    if (!cr || !parse_content_range(*cr, a, b, total) || a != offset || b + 1 != offer.bytes || total != offer.bytes) {
      return Status::error("206 with Content-Range '" + cr.value_or("") + "', expected bytes " + std::to_string(offset) +
                           "-" + std::to_string(offer.bytes - 1) + "/" + std::to_string(offer.bytes));
    }
  } else if (head.status != 200) {
    if (head.status == 416 && ::ftruncate(fd, 0) == 0) {}  // our part is not a prefix: restart clean
    return Status::error("the coordinator answered " + std::to_string(head.status));
  }
  if (std::optional<std::string> sha = head.header("x-essaim-sha256"); sha && *sha != offer.sha256)  // another file
    return Status::refusal("X-Essaim-Sha256 " + *sha + " differs from the catalogue's " + offer.sha256);
  const std::optional<std::string> len = head.header("content-length");
  if (len && *len != std::to_string(expected))
    return Status::error("Content-Length " + *len + ", expected " + std::to_string(expected));
  return Status::ok();
}

// One attempt's transfer: the slice's bytes from `offset` on, appended to `fd`.
Status fetch_rest(const net::HttpUrl& coordinator, const std::string& token, const SliceOffer& offer,
                  const DownloadOptions& options, int fd, const std::string& part, uint64_t offset, Progress& progress,
                  DownloadReport& report) {
  net::HttpCall call{.method = "GET", .target = offer.url, .bearer = token, .body = {}, .headers = {}};
  call.read_timeout = options.read_timeout;
  if (offset > 0) call.headers.emplace_back("Range", "bytes=" + std::to_string(offset) + "-");
  uint64_t expected = offer.bytes - offset;
  uint64_t written = 0;
  return net::http_stream(
      coordinator, call,
      [&](const net::HttpAnswer& head) -> Status {
        ESSAIM_RETURN_IF_ERROR(check_slice_head(head, offer, fd, part, offset, expected));
        progress.advance(offset - std::min<uint64_t>(offset, progress.done()));
        return Status::ok();
      },
      [&](std::span<const char> bytes) -> Status {
        if (written + bytes.size() > expected) return Status::error("the body is longer than the slice");
        size_t off = 0;
        while (off < bytes.size()) {
          const ssize_t n = ::write(fd, bytes.data() + off, bytes.size() - off);
          if (n < 0 && errno == EINTR) continue;
          if (n <= 0) return Status::error("writing " + part + ": " + errno_text());
          off += size_t(n);
        }
        written += bytes.size();
        report.bytes_fetched += bytes.size();
        progress.advance(bytes.size());
        return Status::ok();
      });
}

// The verified part file renamed into place, the rename made durable.
Status install_part(const std::string& part, const std::string& path, const std::string& data_dir) {
  if (::rename(part.c_str(), path.c_str()) != 0)
    return Status::error("cannot rename " + part + " to " + path + ": " + errno_text());
  if (const int dir = ::open(data_dir.c_str(), O_RDONLY | O_DIRECTORY); dir >= 0) {
    ::fsync(dir);  // the rename survives a crash
    ::close(dir);
  }
  return Status::ok();
}

}  // namespace

Result<DownloadReport> download_slice(const net::HttpUrl& coordinator, const std::string& token, const SliceOffer& offer,
                                      const std::string& data_dir, const DownloadOptions& options) {
  if (!is_plain_slice_name(offer.name)) return Status::error("slice name '" + offer.name + "' is not a plain file name");
  if (!is_hex64(offer.sha256)) return Status::error("slice " + offer.name + ": the catalogue's sha256 is not 64 hex digits");
  DownloadReport report;
  report.path = (fs::path(data_dir) / offer.name).string();
  const std::string part = report.path + ".part";
  if (verified_copy(report.path, offer)) {
    report.already_present = true;
    return report;
  }
  std::error_code ec;
  fs::remove(report.path, ec);  // a stale or damaged copy, if any: fetched again below
  if (std::optional<uint64_t> have = file_size(part); have && *have <= offer.bytes) report.resumed_from = *have;

  Progress progress(offer.name, offer.bytes, ProgressOptions{.enabled = options.progress ? std::nullopt : std::optional<bool>(false)});
  std::string last_error = "no attempt made";
  auto pause = options.retry_pause;
  for (int attempt = 1; attempt <= options.attempts; ++attempt) {
    report.attempts = attempt;
    if (attempt > 1) {
      std::this_thread::sleep_for(pause);
      pause *= 2;
    }
    uint64_t offset = file_size(part).value_or(0);
    if (offset > offer.bytes) offset = 0;  // longer than the slice: not ours
    ESSAIM_ASSIGN_OR_RETURN(const int fd, open_part(part, offset));
    progress.set_total(offer.bytes);
    const Status fetched =
        offset < offer.bytes ? fetch_rest(coordinator, token, offer, options, fd, part, offset, progress, report) : Status::ok();
    const bool synced = ::fsync(fd) == 0;
    ::close(fd);
    if (!synced) return Status::error("cannot sync " + part + ": " + errno_text());
    if (fetched.permanent()) return fetched.with_context("downloading " + offer.name);
    const uint64_t have = file_size(part).value_or(0);
    if (!fetched) {
      last_error = fetched.message();
      if (have > offer.bytes) ::truncate(part.c_str(), 0);
      continue;  // resumed from what arrived
    }
    if (have != offer.bytes) {
      last_error = "got " + std::to_string(have) + " bytes, the catalogue says " + std::to_string(offer.bytes);
      ::truncate(part.c_str(), 0);
      continue;
    }
    Result<std::string> sha = file_sha256_hex(part);
    if (!sha) return sha.status().with_context("hashing " + part);
    if (*sha != offer.sha256) {
      last_error = "SHA-256 " + *sha + " differs from the catalogue's " + offer.sha256;
      ::truncate(part.c_str(), 0);  // which byte is wrong is unknown: all of it again
      progress.set_total(offer.bytes);
      continue;
    }
    ESSAIM_RETURN_IF_ERROR(install_part(part, report.path, data_dir));
    progress.finish();
    return report;
  }
  return Status::error("downloading " + offer.name + ": gave up after " + std::to_string(options.attempts) +
                       " attempts; last: " + last_error);
}


}  // namespace essaim::node
