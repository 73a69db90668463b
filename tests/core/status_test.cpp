// Status: an error keeps whether retrying can cure it through every context added on the way up.
#include "core/status.h"

#include <gtest/gtest.h>

namespace essaim {
namespace {

Result<int> refused() { return Status::refusal("the coordinator answered 401"); }

Status caller() {
  ESSAIM_ASSIGN_OR_RETURN(int v, refused());
  return v == 0 ? Status::ok() : Status::error("unreachable");
}

TEST(Status, ARefusalStaysPermanentThroughContextAndResults) {
  const Status s = caller().with_context("GET /api/whoami");
  EXPECT_FALSE(s.is_ok());
  EXPECT_TRUE(s.permanent());
  EXPECT_EQ(s.message(), "GET /api/whoami: the coordinator answered 401");
  EXPECT_FALSE(Status::error("timed out").permanent());
  EXPECT_FALSE(Status::error("timed out").with_context("GET /x").permanent());
  EXPECT_FALSE(Status::ok().permanent());
}

}  // namespace
}  // namespace essaim
