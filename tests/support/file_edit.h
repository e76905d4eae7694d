// ZeroInPlace: damages a file the way a disk fault or a hostile writer would — bytes overwritten
// where they lie, same inode, same size — for the tests of what loading such a file does.
#ifndef ATTNSERVE_TESTS_SUPPORT_FILE_EDIT_H_
#define ATTNSERVE_TESTS_SUPPORT_FILE_EDIT_H_

#include <cstddef>
#include <filesystem>

namespace attnserve::testing {

// Overwrites `count` bytes of `path` from `offset` with zeros, in place (no rename; the range must
// lie inside the file, which keeps its size). Then moves the file's modification time one second
// past its old value: the kernel stamps times from a coarse clock, so a write right after the file
// was created may keep its mtime, and a repository poll that compares (size, mtime, ctime, inode)
// would not see the change; a later real write would. gtest failures on error.
void ZeroInPlace(const std::filesystem::path& path, size_t offset, size_t count);

}  // namespace attnserve::testing

#endif  // ATTNSERVE_TESTS_SUPPORT_FILE_EDIT_H_
