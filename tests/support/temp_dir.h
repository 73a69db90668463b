// A fresh directory of its own under the system's temp dir, for the files one test program writes.
//   const std::string dir = essaim::testing::make_temp_dir("essaim-worker-q4km");  // /tmp/essaim-worker-q4km-Ab3xYz
// The names come from mkdtemp / mkstemp, not from the pid: test programs in different pid namespaces (CI jobs sharing
// /tmp) may have the same pid, and one rewriting the other's mapped model kills it with SIGBUS.
#pragma once

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace essaim::testing {

// A '/' in the prefix (a parameterised test's name) becomes '-'. make_temp_dir puts the directory directly
// under the system's temp dir; make_temp_dir_in under `parent` (created if missing).
inline std::string make_temp_dir_in(const std::filesystem::path& parent, std::string prefix) {
  for (char& c : prefix)
    if (c == '/') c = '-';
  std::filesystem::create_directories(parent);
  const std::string pattern = (parent / (prefix + "-XXXXXX")).string();
  std::vector<char> name(pattern.begin(), pattern.end());
  name.push_back('\0');
  if (::mkdtemp(name.data()) == nullptr)
    throw std::runtime_error("mkdtemp '" + pattern + "': " + std::strerror(errno));
  return std::string(name.data());
}

inline std::string make_temp_dir(std::string prefix) {
  return make_temp_dir_in(std::filesystem::temp_directory_path(), std::move(prefix));
}

// A new empty file named PATH.XXXXXX (mkstemp) beside `path`: where a test writes a file before renaming it
// over `path`, so that concurrent test processes never map one another's half-written file.
inline std::string make_temp_file_beside(const std::string& path) {
  std::vector<char> name(path.begin(), path.end());
  for (char c : std::string(".XXXXXX")) name.push_back(c);
  name.push_back('\0');
  const int fd = ::mkstemp(name.data());
  if (fd < 0) throw std::runtime_error("mkstemp '" + path + ".XXXXXX': " + std::strerror(errno));
  ::close(fd);
  return std::string(name.data());
}

}  // namespace essaim::testing
