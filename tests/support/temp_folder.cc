#include "tests/support/temp_folder.h"

#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <system_error>

#include "gtest/gtest.h"

namespace attnserve::testing {

TempFolder::TempFolder(std::string_view prefix) {
  std::string pattern =
      (std::filesystem::path(::testing::TempDir()) / (std::string(prefix) + ".XXXXXX")).string();
  if (mkdtemp(pattern.data()) == nullptr) {
    ADD_FAILURE() << "mkdtemp(" << pattern << "): " << std::strerror(errno);
    return;
  }
  path_ = pattern;
}

TempFolder::~TempFolder() {
  if (path_.empty()) return;
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

}  // namespace attnserve::testing
