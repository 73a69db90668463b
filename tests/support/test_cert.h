// A throw-away self-signed certificate made by the openssl CLI in a fresh folder (never committed): for
// 127.0.0.1 and localhost by default, or for the names given (a certificate for another host).
//
//   TestCert c = make_test_cert("tls");                              // c.cert, c.key: PEM files
//   TestCert other = make_test_cert("other", "DNS:other.example");   // trusted, but not for 127.0.0.1
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "temp_dir.h"

namespace essaim::testing {

struct TestCert {
  std::string dir, cert, key;
};

inline TestCert make_test_cert(const std::string& name, const std::string& subject_alt_names = "IP:127.0.0.1,DNS:localhost") {
  TestCert c;
  c.dir = make_temp_dir("essaim-cert-" + name);
  c.cert = c.dir + "/cert.pem", c.key = c.dir + "/key.pem";
  const std::string cmd = "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=essaim-test -addext "
                          "subjectAltName=" + subject_alt_names + " -keyout " + c.key + " -out " + c.cert + " >/dev/null 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return c;
}

}  // namespace essaim::testing
