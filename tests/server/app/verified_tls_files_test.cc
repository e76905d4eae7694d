// The TLS files' OpenSSL check (tls_file_set.h) and the checked private copy gRPC reads
// (verified_tls_files.h), on certificates made by deploy/make-test-certs.sh: every content an
// operator's file can pass through (empty, half-written, garbage, mismatched, deleted) is refused
// and leaves the last good set in the copy; a good new set replaces it.
#include "server/app/verified_tls_files.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/app/tls_file_set.h"
#include "tests/support/temp_folder.h"

namespace attnserve::testing::verified_tls_files_test {
namespace {

namespace fs = std::filesystem;
using server::CheckTlsFileSet;
using server::TlsFile;
using server::TlsFileSet;
using server::TlsOptions;
using server::VerifiedTlsFiles;
using ::testing::HasSubstr;

std::string Read(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

void Write(const fs::path& path, const std::string& contents) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file << contents;
}

class TlsFilesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    certs_ = new TempFolder("attnserve-tls-files");
    const std::string command = absl::StrCat(MAKE_TEST_CERTS, " ", certs_->path().string());
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
  }
  static void TearDownTestSuite() {
    delete certs_;
    certs_ = nullptr;
  }
  static std::string Cert(const std::string& name) { return Read(certs_->path() / name); }
  static TlsFileSet Set(const std::string& name, const std::string& ca = "") {
    return {.cert_chain = Cert(name + ".pem"),
            .private_key = Cert(name + ".key"),
            .client_ca = ca.empty() ? "" : Cert(ca)};
  }

  // The operator's files in temp_, holding `name`'s pair (and ca.pem as client CA when mutual).
  TlsOptions Install(const std::string& name, bool mutual = false) {
    Write(chain(), Cert(name + ".pem"));
    Write(key(), Cert(name + ".key"));
    TlsOptions options{.cert_chain_path = chain().string(),
                       .private_key_path = key().string(),
                       .refresh_interval_s = 3600};  // Tests check with CheckNow.
    if (mutual) {
      Write(ca(), Cert("ca.pem"));
      options.client_ca_path = ca().string();
    }
    return options;
  }
  fs::path chain() const { return temp_.path() / "server.pem"; }
  fs::path key() const { return temp_.path() / "server.key"; }
  fs::path ca() const { return temp_.path() / "ca.pem"; }

  static TempFolder* certs_;
  TempFolder temp_;
};

TempFolder* TlsFilesTest::certs_ = nullptr;

TEST_F(TlsFilesTest, AValidPairPassesAndEachBrokenFileIsNamed) {
  EXPECT_TRUE(CheckTlsFileSet(Set("server"), false).ok());
  EXPECT_TRUE(CheckTlsFileSet(Set("server", "ca.pem"), true).ok());
  struct Case {
    const char* what;
    TlsFileSet set;
    bool mutual;
    TlsFile file;
    const char* message;
  };
  const TlsFileSet good = Set("server");
  const std::string chain = good.cert_chain;
  std::vector<Case> cases = {
      {"empty chain", {"", good.private_key, ""}, false, TlsFile::kCertChain, "is empty"},
      {"empty key", {chain, "", ""}, false, TlsFile::kPrivateKey, "is empty"},
      {"garbage chain",
       {"not a pem\n", good.private_key, ""},
       false,
       TlsFile::kCertChain,
       "no PEM certificate"},
      {"half a chain",
       {chain.substr(0, chain.size() / 2), good.private_key, ""},
       false,
       TlsFile::kCertChain,
       "no PEM certificate"},
      {"chain, then half a second certificate",
       {chain + chain.substr(0, chain.size() / 2), good.private_key, ""},
       false,
       TlsFile::kCertChain,
       "2 PEM blocks of which 1 parse"},
      {"half a key",
       {chain, good.private_key.substr(0, good.private_key.size() / 2), ""},
       false,
       TlsFile::kPrivateKey,
       "no readable PEM private key"},
      {"a certificate as the key",
       {chain, chain, ""},
       false,
       TlsFile::kPrivateKey,
       "no readable PEM private key"},
      {"another certificate's key",
       {chain, Cert("server2.key"), ""},
       false,
       TlsFile::kPrivateKey,
       "does not match"},
      {"mutual without CA", good, true, TlsFile::kClientCa, "is empty"},
      {"mutual with a key as CA",
       {chain, good.private_key, good.private_key},
       true,
       TlsFile::kClientCa,
       "no PEM certificate"},
  };
  for (const Case& c : cases) {
    TlsFile bad = TlsFile::kCertChain;
    const absl::Status status = CheckTlsFileSet(c.set, c.mutual, &bad);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_EQ(bad, c.file) << c.what;
    EXPECT_THAT(status.message(), HasSubstr(server::TlsFileOption(c.file))) << c.what;
    EXPECT_THAT(status.message(), HasSubstr(c.message)) << c.what << ": " << status;
  }
}

TEST_F(TlsFilesTest, StartRefusesASetGrpcCouldNotServeNamingTheFile) {
  TlsOptions options = Install("server");
  Write(key(), "");
  absl::StatusOr<std::unique_ptr<VerifiedTlsFiles>> files = VerifiedTlsFiles::Start(options, {});
  ASSERT_FALSE(files.ok());
  EXPECT_THAT(files.status().message(), HasSubstr("tls_private_key: is empty"));
  EXPECT_THAT(files.status().message(), HasSubstr(key().string()));
  fs::remove(chain());
  files = VerifiedTlsFiles::Start(options, {});
  EXPECT_EQ(files.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(files.status().message(), HasSubstr("tls_cert_chain: cannot read"));
}

TEST_F(TlsFilesTest, TheCopyKeepsTheLastGoodSetThroughEveryBadContent) {
  std::vector<TlsFile> counted;
  absl::StatusOr<std::unique_ptr<VerifiedTlsFiles>> started = VerifiedTlsFiles::Start(
      Install("server", /*mutual=*/true), [&](TlsFile file) { counted.push_back(file); });
  ASSERT_TRUE(started.ok()) << started.status();
  VerifiedTlsFiles& files = **started;
  const TlsFileSet good = Set("server", "ca.pem");
  auto copy = [&] {
    return TlsFileSet{Read(files.cert_chain_path()), Read(files.private_key_path()),
                      Read(files.client_ca_path())};
  };
  ASSERT_EQ(copy(), good);
  ASSERT_NE(files.cert_chain_path().find("attnserve-tls-"), std::string::npos);

  struct Step {
    fs::path path;
    std::string contents;  // "-" deletes the file.
    TlsFile file;
  };
  const std::string key_text = Cert("server.key");
  const std::vector<Step> steps = {
      {chain(), "", TlsFile::kCertChain},
      {chain(), "-----BEGIN CERTIFICATE-----\nMIIB", TlsFile::kCertChain},
      {chain(), "-", TlsFile::kCertChain},
      {key(), "", TlsFile::kPrivateKey},
      {key(), key_text.substr(0, 40), TlsFile::kPrivateKey},
      {key(), Cert("server2.key"), TlsFile::kPrivateKey},
      {ca(), "", TlsFile::kClientCa},
      {ca(), "garbage", TlsFile::kClientCa},
  };
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& step = steps[i];
    const std::string before = Read(step.path);
    if (step.contents == "-") {
      fs::remove(step.path);
    } else {
      Write(step.path, step.contents);
    }
    files.CheckNow();  // Seen once: not reported yet (a rotation may be half-way).
    EXPECT_EQ(counted.size(), i) << "step " << i;
    files.CheckNow();  // Seen twice: reported once, and counted under its file.
    files.CheckNow();
    ASSERT_EQ(counted.size(), i + 1) << "step " << i;
    EXPECT_EQ(counted.back(), step.file) << "step " << i;
    EXPECT_EQ(copy(), good) << "step " << i;
    EXPECT_EQ(files.generation(), 1);
    Write(step.path, before);
    files.CheckNow();
  }
  EXPECT_EQ(files.reported_failures(), static_cast<int64_t>(steps.size()));

  // A rotation that writes the certificate before the key is published once both are there,
  // without a report for the mismatched moment in between.
  Write(chain(), Cert("server2.pem"));
  files.CheckNow();
  EXPECT_EQ(copy(), good);
  Write(key(), Cert("server2.key"));
  files.CheckNow();
  EXPECT_EQ(files.generation(), 2);
  EXPECT_EQ(copy(), Set("server2", "ca.pem"));
  EXPECT_EQ(files.reported_failures(), static_cast<int64_t>(steps.size()));
}

TEST_F(TlsFilesTest, TheCopyIsRemovedWithTheWatcher) {
  absl::StatusOr<std::unique_ptr<VerifiedTlsFiles>> files =
      VerifiedTlsFiles::Start(Install("server"), {});
  ASSERT_TRUE(files.ok()) << files.status();
  const fs::path folder = fs::path((*files)->cert_chain_path()).parent_path().parent_path();
  ASSERT_TRUE(fs::exists(folder));
  EXPECT_EQ(fs::status(folder).permissions() & fs::perms::all, fs::perms::owner_all);
  files->reset();
  EXPECT_FALSE(fs::exists(folder));
}

// Sets TMPDIR (or unsets it, for nullptr) for one scope, restoring what it was.
class ScopedTmpdir {
 public:
  explicit ScopedTmpdir(const char* value) {
    if (const char* old = std::getenv("TMPDIR"); old != nullptr) old_ = old;
    if (value == nullptr) {
      unsetenv("TMPDIR");
    } else {
      setenv("TMPDIR", value, /*overwrite=*/1);
    }
  }
  ~ScopedTmpdir() {
    if (old_.has_value()) {
      setenv("TMPDIR", old_->c_str(), /*overwrite=*/1);
    } else {
      unsetenv("TMPDIR");
    }
  }

 private:
  std::optional<std::string> old_;
};

// A container with a read-only root filesystem has no writable /tmp but always a /dev/shm.
TEST_F(TlsFilesTest, WithoutTmpdirTheCopyIsKeptInMemory) {
  if (!fs::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm on this machine";
  ScopedTmpdir unset(nullptr);
  absl::StatusOr<std::unique_ptr<VerifiedTlsFiles>> files =
      VerifiedTlsFiles::Start(Install("server"), {});
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_THAT((*files)->cert_chain_path(), ::testing::StartsWith("/dev/shm/attnserve-tls-"));
}

TEST_F(TlsFilesTest, AnUnwritableTmpdirIsAnErrorThatSaysWhatToSet) {
  const std::string missing = (temp_.path() / "no-such-folder").string();
  ScopedTmpdir set(missing.c_str());
  absl::StatusOr<std::unique_ptr<VerifiedTlsFiles>> files =
      VerifiedTlsFiles::Start(Install("server"), {});
  ASSERT_FALSE(files.ok());
  EXPECT_TRUE(absl::IsInternal(files.status())) << files.status();
  EXPECT_THAT(files.status().message(), HasSubstr(missing));
  EXPECT_THAT(files.status().message(), HasSubstr("set TMPDIR to a writable folder"));
}

}  // namespace
}  // namespace attnserve::testing::verified_tls_files_test
