// The accept guard (accept_guard.h) against the kernel's answers played by a fake accept4: it
// sheds every waiting connection past one aborted while queued (ECONNABORTED), and gets its spare
// descriptor back after losing it at the limit. Each test runs in its own process (ctest), so the
// process-wide guard starts fresh.
#include "server/app/accept_guard.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <deque>

namespace attnserve::server {
namespace {

// What the fake accept4 answers, in order: a connection (a /dev/null descriptor) or an errno;
// EAGAIN once they run out. `hook` runs before it answers its call number `hook_at` (from 0).
constexpr int kConnection = 0;
std::deque<int> answers;
int calls = 0;
int hook_at = -1;
void (*hook)() = nullptr;

int FakeAccept4(int /*listener*/, sockaddr* /*address*/, socklen_t* /*length*/, int /*flags*/) {
  if (calls++ == hook_at && hook != nullptr) hook();
  if (answers.empty()) {
    errno = EAGAIN;
    return -1;
  }
  const int answer = answers.front();
  answers.pop_front();
  if (answer == kConnection) return open("/dev/null", O_RDONLY | O_CLOEXEC);
  errno = answer;
  return -1;
}

class AcceptGuardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetWrappedAccept4ForTesting(&FakeAccept4);
    ASSERT_TRUE(ArmAcceptGuard().ok());
  }
  void TearDown() override { SetWrappedAccept4ForTesting(nullptr); }
};

TEST_F(AcceptGuardTest, AConnectionAbortedWhileQueuedDoesNotStopTheShedding) {
  answers = {EMFILE, kConnection, ECONNABORTED, kConnection, kConnection, EAGAIN};
  const int64_t before = ConnectionsShedAtFileLimit();
  EXPECT_EQ(accept4(-1, nullptr, nullptr, SOCK_CLOEXEC), -1);
  EXPECT_EQ(errno, EAGAIN);  // gRPC re-arms its listener on EAGAIN.
  EXPECT_EQ(ConnectionsShedAtFileLimit() - before, 3);
  EXPECT_TRUE(answers.empty());
}

rlimit saved_limit{};

// At the limit while shedding: the spare cannot be reopened (every open fails).
void NoDescriptorsLeft() {
  getrlimit(RLIMIT_NOFILE, &saved_limit);
  rlimit none = saved_limit;
  none.rlim_cur = 0;
  setrlimit(RLIMIT_NOFILE, &none);
}

TEST_F(AcceptGuardTest, ASpareLostAtTheLimitIsReopenedOnceDescriptorsAreFree) {
  // An episode with descriptors to spare first: its warning is logged now, so the one of the
  // episode below (at most one a second) is not, and nothing logs while no descriptor is free.
  // (UBSan's vptr check of the logger would need a descriptor for its probe and then report a
  // valid logger as an invalid object: the sanitizer's own limit, not the guard's.)
  answers = {EMFILE, EAGAIN};
  EXPECT_EQ(accept4(-1, nullptr, nullptr, SOCK_CLOEXEC), -1);

  // Episode 1: the spare is closed to make room, and cannot be reopened.
  answers = {EMFILE, EAGAIN};
  calls = 0;
  hook_at = 1;  // The shedding accept4, after the spare was closed.
  hook = &NoDescriptorsLeft;
  EXPECT_EQ(accept4(-1, nullptr, nullptr, SOCK_CLOEXEC), -1);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved_limit), 0);
  hook = nullptr;

  // Descriptors are free again; the next accept4 (here an ordinary EAGAIN) takes the spare back.
  answers = {EAGAIN};
  EXPECT_EQ(accept4(-1, nullptr, nullptr, SOCK_CLOEXEC), -1);
  EXPECT_EQ(errno, EAGAIN);

  // Episode 2 sheds again.
  const int64_t before = ConnectionsShedAtFileLimit();
  answers = {EMFILE, kConnection, kConnection, EAGAIN};
  EXPECT_EQ(accept4(-1, nullptr, nullptr, SOCK_CLOEXEC), -1);
  EXPECT_EQ(ConnectionsShedAtFileLimit() - before, 2);
}

}  // namespace
}  // namespace attnserve::server
