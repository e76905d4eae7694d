// Threads of this process by name (Linux: /proc/self/task/*/comm, 15 characters at most). Lets
// tests check which threads a component starts, e.g. the batch scheduler's "attnserve-batch"
// threads. A new thread carries its creator's name until it names itself, so a thread that a
// component's thread starts for a library (gRPC's thread pools start threads from whichever thread
// schedules work) briefly carries the component's name. Thread-safe; a thread that exits meanwhile
// is not counted.
#ifndef ATTNSERVE_TESTS_SUPPORT_THREAD_NAMES_H_
#define ATTNSERVE_TESTS_SUPPORT_THREAD_NAMES_H_

#include <optional>
#include <set>
#include <string>
#include <string_view>

namespace attnserve::testing {

int CountThreadsNamed(std::string_view name);

// The thread ids (TIDs) of the threads named `name`.
std::set<int> ThreadIdsNamed(std::string_view name);

// Thread `tid`'s name now, or nullopt once it has exited.
std::optional<std::string> ThreadName(int tid);

}  // namespace attnserve::testing

#endif  // ATTNSERVE_TESTS_SUPPORT_THREAD_NAMES_H_
