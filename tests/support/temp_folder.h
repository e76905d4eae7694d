// TempFolder: a fresh, uniquely named folder under ::testing::TempDir() for one test, removed
// with everything in it when the object goes away. Not thread-safe to create and destroy
// concurrently with use; hand out path() freely.
#ifndef ATTNSERVE_TESTS_SUPPORT_TEMP_FOLDER_H_
#define ATTNSERVE_TESTS_SUPPORT_TEMP_FOLDER_H_

#include <filesystem>
#include <string_view>

namespace attnserve::testing {

class TempFolder {
 public:
  // Creates <TempDir>/<prefix>.XXXXXX; a failure is a gtest failure (path() is then empty).
  explicit TempFolder(std::string_view prefix = "attnserve");
  ~TempFolder();
  TempFolder(const TempFolder&) = delete;
  TempFolder& operator=(const TempFolder&) = delete;

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace attnserve::testing

#endif  // ATTNSERVE_TESTS_SUPPORT_TEMP_FOLDER_H_
