#include "tests/support/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

extern char** environ;

namespace attnserve::testing {

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Start(
    const std::string& program, const std::vector<std::string>& args) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
  std::vector<std::string> storage = {program};
  storage.insert(storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& arg : storage) argv.push_back(arg.data());
  argv.push_back(nullptr);
  // The test process may block signals in its threads; the child must start with none blocked.
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attributes, &none);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK);
  pid_t pid = 0;
  const int error = posix_spawn(&pid, program.c_str(), &actions, &attributes, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  close(fds[1]);
  if (error != 0) {
    close(fds[0]);
    return absl::InternalError(absl::StrCat("cannot start ", program, ": ", std::strerror(error)));
  }
  return std::unique_ptr<ChildProcess>(new ChildProcess(pid, fds[0]));
}

ChildProcess::ChildProcess(pid_t pid, int output_fd)
    : pid_(pid),
      output_fd_(output_fd),
      reader_([this] { ReadOutput(); }),
      waiter_([this] { AwaitExit(); }) {}

ChildProcess::~ChildProcess() {
  bool reaped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    reaped = reaped_;
  }
  if (!reaped) kill(pid_, SIGKILL);
  waiter_.join();
  reader_.join();
  close(output_fd_);
}

void ChildProcess::AwaitExit() {
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  std::lock_guard<std::mutex> lock(mu_);
  reaped_ = true;
  exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  changed_.notify_all();
}

void ChildProcess::ReadOutput() {
  char buffer[4096];
  while (true) {
    const ssize_t n = read(output_fd_, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    std::lock_guard<std::mutex> lock(mu_);
    if (n <= 0) {
      output_closed_ = true;
      changed_.notify_all();
      return;
    }
    output_.append(buffer, static_cast<size_t>(n));
    changed_.notify_all();
  }
}

std::vector<std::string> ChildProcess::Lines() const {
  std::lock_guard<std::mutex> lock(mu_);
  return absl::StrSplit(output_, '\n', absl::SkipEmpty());
}

std::string ChildProcess::Output() const {
  std::lock_guard<std::mutex> lock(mu_);
  return output_;
}

std::optional<std::string> ChildProcess::WaitForLine(std::string_view text,
                                                     absl::Duration timeout) {
  const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoMicroseconds(timeout);
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    for (absl::string_view line : absl::StrSplit(output_, '\n')) {
      if (line.find(absl::string_view(text.data(), text.size())) != absl::string_view::npos) {
        return std::string(line);
      }
    }
    if (output_closed_) return std::nullopt;
    if (changed_.wait_until(lock, deadline) == std::cv_status::timeout) return std::nullopt;
  }
}

int ChildProcess::WaitForLines(std::string_view text, int count, absl::Duration timeout) {
  const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoMicroseconds(timeout);
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    int found = 0;
    for (absl::string_view line : absl::StrSplit(output_, '\n')) {
      found += line.find(absl::string_view(text.data(), text.size())) != absl::string_view::npos;
    }
    if (found >= count || output_closed_) return found;
    if (changed_.wait_until(lock, deadline) == std::cv_status::timeout) return found;
  }
}

void ChildProcess::Signal(int signal) { kill(pid_, signal); }

int ChildProcess::Wait(absl::Duration timeout) {
  const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoMicroseconds(timeout);
  std::unique_lock<std::mutex> lock(mu_);
  // Exited and all its output read: the pipe may still hold the last lines when the exit is seen.
  if (!changed_.wait_until(lock, deadline, [this] { return reaped_ && output_closed_; })) {
    return -1;
  }
  return exit_code_;
}

}  // namespace attnserve::testing
