// A fresh directory of its own under the system's temp dir, for the files one test program writes.
//   const std::string dir = essaim::testing::make_temp_dir("essaim-worker-q4km");  // /tmp/essaim-worker-q4km-Ab3xYz
// The name comes from mkdtemp, not from the pid: test programs in different pid namespaces (CI jobs sharing
// /tmp) may have the same pid, and one rewriting the other's mapped model kills it with SIGBUS.
#pragma once

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace essaim::testing {

// A '/' in the prefix (a parameterised test's name) becomes '-': the directory sits directly under the temp dir.
inline std::string make_temp_dir(std::string prefix) {
  for (char& c : prefix)
    if (c == '/') c = '-';
  const std::string pattern = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
  std::vector<char> name(pattern.begin(), pattern.end());
  name.push_back('\0');
  if (::mkdtemp(name.data()) == nullptr)
    throw std::runtime_error("mkdtemp '" + pattern + "': " + std::strerror(errno));
  return std::string(name.data());
}

}  // namespace essaim::testing
