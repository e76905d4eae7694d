#include "tests/support/thread_names.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

namespace attnserve::testing {

int CountThreadsNamed(std::string_view name) {
  int count = 0;
  std::error_code error;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", error)) {
    std::ifstream comm(task.path() / "comm");
    std::string line;
    if (std::getline(comm, line) && line == name) ++count;
  }
  return count;
}

}  // namespace attnserve::testing
