// The decoding flags map onto ServerOptions::decoding with their units converted, and the
// environment names work as for every other flag.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "server/app/server_flags.h"

namespace attnserve::testing {
namespace {

server::ServerFlags Parse(std::vector<std::string> args) {
  CLI::App app("attnserve");
  server::ServerFlags flags;
  server::AddServerFlags(app, flags);
  args.insert(args.begin(), "attnserve");
  std::vector<const char*> argv;
  for (const std::string& arg : args) argv.push_back(arg.c_str());
  app.parse(static_cast<int>(argv.size()), argv.data());
  server::FinishServerFlags(flags);
  return flags;
}

TEST(DecodeFlagsTest, DefaultsAreTheRuntimeDefaults) {
  const server::ServerFlags flags = Parse({});
  const decoding::DecodeRuntimeOptions& decoding = flags.server.decoding;
  EXPECT_EQ(decoding.kv.budget_bytes, 0);  // Derived from the memory limit (kv_cache_budget.h).
  EXPECT_EQ(decoding.kv.prefault_ahead_bytes, decoding::KvBudgetOptions{}.prefault_ahead_bytes);
  EXPECT_EQ(decoding.scheduling.max_iteration_tokens, 512);
  EXPECT_EQ(decoding.scheduling.prefill_chunk_tokens, 256);
  EXPECT_EQ(decoding.idle_timeout_us, int64_t{60} * 1000 * 1000);
  EXPECT_EQ(decoding.max_sessions, 4096);
  EXPECT_EQ(flags.server.repository.load.default_kv_cache_dtype, model::KvCacheDtype::kAuto);
}

TEST(DecodeFlagsTest, KvCacheDtypeFromTheFlagOrTheEnvironment) {
  EXPECT_EQ(Parse({"--kv-cache-dtype", "int8"}).server.repository.load.default_kv_cache_dtype,
            model::KvCacheDtype::kInt8);
  ::setenv("ATTNSERVE_KV_CACHE_DTYPE", "int8", 1);
  const server::ServerFlags flags = Parse({});
  ::unsetenv("ATTNSERVE_KV_CACHE_DTYPE");
  EXPECT_EQ(flags.server.repository.load.default_kv_cache_dtype, model::KvCacheDtype::kInt8);
  EXPECT_THROW(Parse({"--kv-cache-dtype", "fp8"}), CLI::ValidationError);
}

TEST(DecodeFlagsTest, FlagsAndEnvironmentSetTheRuntimeOptions) {
  ::setenv("ATTNSERVE_DECODE_IDLE_TIMEOUT_S", "2.5", 1);
  const server::ServerFlags flags =
      Parse({"--kv-cache-budget-mb", "64", "--decode-max-iteration-tokens", "128",
             "--decode-prefill-chunk-tokens", "32", "--decode-max-sessions", "9",
             "--kv-cache-prefault-mb", "0"});
  ::unsetenv("ATTNSERVE_DECODE_IDLE_TIMEOUT_S");
  const decoding::DecodeRuntimeOptions& decoding = flags.server.decoding;
  EXPECT_EQ(decoding.kv.budget_bytes, int64_t{64} << 20);
  EXPECT_EQ(decoding.scheduling.max_iteration_tokens, 128);
  EXPECT_EQ(decoding.scheduling.prefill_chunk_tokens, 32);
  EXPECT_EQ(decoding.idle_timeout_us, 2'500'000);
  EXPECT_EQ(decoding.max_sessions, 9);
  EXPECT_EQ(decoding.kv.prefault_ahead_bytes, 0);
}

TEST(DecodeFlagsTest, OutOfRangeValuesAreRefused) {
  EXPECT_THROW(Parse({"--kv-cache-budget-mb", "-1"}), CLI::ValidationError);
  EXPECT_THROW(Parse({"--decode-idle-timeout-s", "-1"}), CLI::ValidationError);
  EXPECT_THROW(Parse({"--decode-max-sessions", "0"}), CLI::ValidationError);
  EXPECT_THROW(Parse({"--kv-cache-prefault-mb", "-1"}), CLI::ValidationError);
}

}  // namespace
}  // namespace attnserve::testing
