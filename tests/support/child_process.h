// ChildProcess: runs a program with its stdout and stderr captured, for tests of the project's
// binaries (start, wait for a log line, signal, collect the exit status).
//
// Thread-safe: the output is collected by a reader thread; every method may be called from any
// thread. The destructor kills (SIGKILL) a child still running and reaps it.
#ifndef ATTNSERVE_TESTS_SUPPORT_CHILD_PROCESS_H_
#define ATTNSERVE_TESTS_SUPPORT_CHILD_PROCESS_H_

#include <sys/types.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace attnserve::testing {

class ChildProcess {
 public:
  // Starts `program` with `args` (argv[1..]); stdout and stderr both go to one pipe. Internal
  // with the system's reason if it cannot be started.
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Start(const std::string& program,
                                                             const std::vector<std::string>& args);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // The first output line containing `text`, waiting up to `timeout` for it; nullopt when it
  // did not appear (timeout, or the child closed its output).
  std::optional<std::string> WaitForLine(std::string_view text, absl::Duration timeout);
  // How many output lines so far contain `text`, waiting up to `timeout` for there to be at
  // least `count`.
  int WaitForLines(std::string_view text, int count, absl::Duration timeout);
  // Sends `signal` to the child.
  void Signal(int signal);
  // The child's process id (for reading /proc/<pid>).
  pid_t pid() const { return pid_; }
  // Waits up to `timeout` for the child to exit and its output to be read to the end; its exit
  // code, or -1 on timeout or death by a signal.
  int Wait(absl::Duration timeout);
  // Everything it printed so far.
  std::string Output() const;
  std::vector<std::string> Lines() const;

 private:
  ChildProcess(pid_t pid, int output_fd);
  void ReadOutput();
  void AwaitExit();

  const pid_t pid_;
  const int output_fd_;
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::string output_;
  bool output_closed_ = false;
  bool reaped_ = false;
  int exit_code_ = -1;
  std::thread reader_;
  std::thread waiter_;
};

}  // namespace attnserve::testing

#endif  // ATTNSERVE_TESTS_SUPPORT_CHILD_PROCESS_H_
