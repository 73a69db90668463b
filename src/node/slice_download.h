// Fetches one slice file from the coordinator (GET /slices/NAME) into a data folder, trusting nothing:
// the bytes go to NAME.part, a restart resumes that file with an HTTP Range request, and only a file whose
// every byte hashes to the catalogue's SHA-256 (which the X-Essaim-Sha256 header must repeat) and whose
// length is the catalogue's is renamed to NAME. A flipped byte, a truncated body or a wrong length is
// refused and fetched again, a bounded number of times.
//
//   SliceOffer offer = ...;                                 // from the catalogue or a volunteer answer
//   ESSAIM_ASSIGN_OR_RETURN(std::string path, download_slice(url, token, offer, "/var/essaim"));
//
// A progress bar is drawn on stderr when it is a terminal (core/progress.h); quiet otherwise.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "net/http_client.h"
#include "node/market_client.h"

namespace essaim::node {

struct DownloadOptions {
  int attempts = 4;                                  // requests in all, resumed or restarted
  std::chrono::milliseconds read_timeout{15'000};    // silence on the connection that aborts an attempt
  std::chrono::milliseconds retry_pause{200};        // between attempts (doubles each time)
  bool progress = true;                              // a bar on a terminal
};

struct DownloadReport {
  std::string path;
  uint64_t bytes_fetched = 0;   // over the network, all attempts
  uint64_t resumed_from = 0;    // bytes of a NAME.part found at start and kept
  int attempts = 0;
  bool already_present = false; // NAME was there and verified: nothing fetched
};

// SHA-256 (lowercase hex) of a whole file, or an error.
Result<std::string> file_sha256_hex(const std::string& path);

// Bytes [offset, offset + length) of a slice file (GET target with `Range: bytes=a-b`), held in memory:
// the answer must be a 206 whose Content-Range is exactly that range and whose body has exactly that many
// bytes (the hot-expert cache's reads; what the bytes are is the caller's check). length <= 1 GiB.
Result<std::vector<uint8_t>> fetch_byte_range(const net::HttpUrl& coordinator, const std::string& token,
                                              const std::string& target, uint64_t offset, uint64_t length,
                                              std::chrono::milliseconds read_timeout = std::chrono::milliseconds(15'000));

Result<DownloadReport> download_slice(const net::HttpUrl& coordinator, const std::string& token, const SliceOffer& offer,
                                      const std::string& data_dir, const DownloadOptions& options = {});

}  // namespace essaim::node
