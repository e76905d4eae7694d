#include "tests/support/thread_names.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

namespace attnserve::testing {

std::set<int> ThreadIdsNamed(std::string_view name) {
  std::set<int> tids;
  std::error_code error;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", error)) {
    const int tid = std::stoi(task.path().filename().string());
    if (ThreadName(tid) == name) tids.insert(tid);
  }
  return tids;
}

int CountThreadsNamed(std::string_view name) {
  return static_cast<int>(ThreadIdsNamed(name).size());
}

std::optional<std::string> ThreadName(int tid) {
  std::ifstream comm("/proc/self/task/" + std::to_string(tid) + "/comm");
  std::string line;
  if (!std::getline(comm, line)) return std::nullopt;
  return line;
}

}  // namespace attnserve::testing
