// CountThreadsNamed: how many threads of this process carry a name (Linux: /proc/self/task/*/comm,
// 15 characters at most). Lets tests check which threads a component starts, e.g. the batch
// scheduler's "attnserve-batch" threads. Thread-safe; a thread that exits meanwhile is not
// counted.
#ifndef ATTNSERVE_TESTS_SUPPORT_THREAD_NAMES_H_
#define ATTNSERVE_TESTS_SUPPORT_THREAD_NAMES_H_

#include <string_view>

namespace attnserve::testing {

int CountThreadsNamed(std::string_view name);

}  // namespace attnserve::testing

#endif  // ATTNSERVE_TESTS_SUPPORT_THREAD_NAMES_H_
