// What this build is, in the terms two machines must agree on before pairing: the version, the git commit
// and build type (fixed at CMake configure time), and the fingerprint the worker handshake announces —
// kernel ABI, the ISA class the kernels selected at run time, the protocol version (docs/protocol.md).
//
//   BuildInfo b = build_info();
//   std::puts(build_info_text(b).c_str());        // `essaim --version`
//   std::puts(build_info_json(b).dump().c_str());  // `essaim version --json`
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "proto/messages.h"

namespace essaim::cli {

struct BuildInfo {
  std::string version;     // the project version (CMake project(VERSION))
  std::string git_commit;  // short hash at configure time, "unknown" outside a git checkout
  std::string build_type;  // Release, Debug, ...
  proto::BuildFingerprint fingerprint;  // exactly what a worker's HELLO carries
  uint16_t protocol_version = proto::kProtocolVersion;
};

BuildInfo build_info();
std::string build_info_text(const BuildInfo& b);     // a few "key: value" lines
nlohmann::json build_info_json(const BuildInfo& b);  // fields: docs/cli.md
std::string build_info_version_flag_text();          // the text without its last newline (CLI11 adds one)

}  // namespace essaim::cli
