#include "tests/support/file_edit.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace attnserve::testing {

void ZeroInPlace(const std::filesystem::path& path, size_t offset, size_t count) {
  const int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0) << "cannot open " << path << ": " << std::strerror(errno);
  struct stat before {};
  const bool stated = fstat(fd, &before) == 0;
  const std::vector<char> zeros(count, 0);
  const bool inside = stated && offset + count <= static_cast<size_t>(before.st_size);
  const ssize_t written =
      inside ? pwrite(fd, zeros.data(), count, static_cast<off_t>(offset)) : ssize_t{-1};
  const int write_errno = errno;
  struct timespec times[2] = {before.st_atim, before.st_mtim};
  times[1].tv_sec += 1;
  const bool touched = inside && futimens(fd, times) == 0;
  close(fd);
  ASSERT_TRUE(stated) << "cannot stat " << path;
  ASSERT_TRUE(inside) << path << ": [" << offset << ", " << offset + count
                      << ") is not inside the file (" << before.st_size << " bytes)";
  ASSERT_EQ(written, static_cast<ssize_t>(count))
      << "cannot write " << path << ": " << std::strerror(write_errno);
  ASSERT_TRUE(touched) << "cannot set the modification time of " << path;
}

}  // namespace attnserve::testing
