// attnserve-cli decode and bench --sessions (decode mode) against a live in-process server on
// 127.0.0.1, run in-process through RunCli: decode's outputs equal a full Attend of the whole
// sequence through the library, and the decode bench sends what it reports (the server's
// decoding runtime counts the tokens).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "attnserve/client/client.h"
#include "client/cli/cli_app.h"
#include "client/cli/npy.h"
#include "client/cli/random_values.h"
#include "nlohmann/json.hpp"
#include "server/decoding/decode_runtime.h"
#include "tests/client/cli/cli_test_support.h"
#include "tests/server/service/server_test_support.h"
#include "tests/support/child_process.h"
#include "tests/support/temp_folder.h"

namespace attnserve::testing {
namespace {

using ::testing::ContainsRegex;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class DecodeCommandsTest : public CliTest {
 protected:
  // The server's answer to one Attend of `rows` (causal) or over `memory` (no mask).
  std::vector<float> AttendAll(const std::vector<float>& rows, const std::vector<float>& memory) {
    absl::StatusOr<std::unique_ptr<client::Client>> client = client::Client::Create(Target());
    EXPECT_TRUE(client.ok()) << client.status();
    client::AttendOptions options;
    if (memory.empty()) {
      options.mask = client::Mask::kCausal;
    } else {
      options.memory = client::TensorView{
          memory, {static_cast<int64_t>(memory.size()) / kSmallWidth, kSmallWidth}};
    }
    absl::StatusOr<client::AttendResult> result = (*client)->Attend(
        kSmallModel, {rows, {static_cast<int64_t>(rows.size()) / kSmallWidth, kSmallWidth}},
        options);
    EXPECT_TRUE(result.ok()) << result.status();
    return result.ok() ? result->output.data : std::vector<float>{};
  }

  decoding::DecodeStats Stats() { return server().decode_runtime().Stats(); }
};

TEST_F(DecodeCommandsTest, DecodeOutputsEqualAFullAttendOfTheWholeSequence) {
  for (const bool cross : {false, true}) {
    SCOPED_TRACE(cross ? "cross" : "self");
    const std::string out_path = (temp_.path() / absl::StrCat("out", cross, ".npy")).string();
    std::vector<std::string> args = {"decode", "--model", "small", "--prompt-rows",
                                     "5",      "--steps", "4",     "--seed",
                                     "9",      "--out",   out_path};
    if (cross) args.insert(args.end(), {"--memory-rows", "3"});
    const CliRun run = Run(args);
    ASSERT_EQ(run.code, 0) << run.err;
    EXPECT_THAT(run.out,
                HasSubstr(cross ? "cross-attention over 3 memory rows" : "causal self-attention"));
    EXPECT_THAT(run.out, HasSubstr("prefill: 5 rows in"));
    EXPECT_THAT(run.out, HasSubstr("steps: 4 one-row steps, latency p50"));
    absl::StatusOr<client::Tensor> output = cli::ReadNpy(out_path);
    ASSERT_TRUE(output.ok()) << output.status();
    EXPECT_THAT(output->shape, ElementsAre(9, kSmallWidth));

    // What the CLI sent: the prompt from the seed, the memory from seed + 1, the steps from
    // seed + 2.
    std::vector<float> rows = cli::RandomValues(5 * kSmallWidth, 9);
    const std::vector<float> steps = cli::RandomValues(4 * kSmallWidth, 11);
    rows.insert(rows.end(), steps.begin(), steps.end());
    const std::vector<float> memory =
        cross ? cli::RandomValues(3 * kSmallWidth, 10) : std::vector<float>{};
    EXPECT_TRUE(Near(output->data, AttendAll(rows, memory)));
  }
}

TEST_F(DecodeCommandsTest, DecodeReadsNpyPromptAndPrintsSummaries) {
  const std::string prompt_path = (temp_.path() / "prompt.npy").string();
  const std::vector<float> prompt = cli::RandomValues(3 * kSmallWidth, 4);
  const std::vector<int64_t> shape = {3, kSmallWidth};
  ASSERT_TRUE(cli::WriteNpy(prompt_path, prompt, shape).ok());
  const CliRun run = Run({"decode", "--model", "small", "--prompt", prompt_path, "--steps", "2"});
  ASSERT_EQ(run.code, 0) << run.err;
  EXPECT_THAT(run.out, HasSubstr("prompt output [3, 16]"));
  EXPECT_THAT(run.out, HasSubstr("step outputs [2, 16]"));
  EXPECT_THAT(run.out, HasSubstr("row 0:"));
}

TEST_F(DecodeCommandsTest, DecodeRefusesBadOptionsAndInputsNamingThem) {
  CliRun run = Run({"decode", "--model", "small", "--steps", "2"});
  EXPECT_EQ(run.code, 1);
  EXPECT_THAT(run.err, HasSubstr("--prompt-rows"));
  const std::string wide_path = (temp_.path() / "wide.npy").string();
  const std::vector<float> wide = cli::RandomValues(2 * 5, 4);
  const std::vector<int64_t> shape = {2, 5};
  ASSERT_TRUE(cli::WriteNpy(wide_path, wide, shape).ok());
  run = Run({"decode", "--model", "small", "--prompt", wide_path});
  EXPECT_EQ(run.code, 1);
  EXPECT_THAT(run.err, HasSubstr("expected a prompt of shape [rows, 16]"));
  run = Run({"decode", "--model", "no-such-model", "--prompt-rows", "2"});
  EXPECT_EQ(run.code, 1);
  EXPECT_THAT(run.err, HasSubstr("NOT_FOUND"));
}

TEST_F(DecodeCommandsTest, BenchSessionsOneClientSendsOneMessagePerRound) {
  const CliRun run = Run({"bench", "--model", "small", "--sessions", "4", "--context", "8",
                          "--steps", "10", "--json", "-q"});
  ASSERT_EQ(run.code, 0) << run.err;
  const nlohmann::json report = nlohmann::json::parse(run.out);
  EXPECT_EQ(report["sessions"], 4);
  EXPECT_EQ(report["clients"], 1);
  EXPECT_EQ(report["decode_tokens"], 40);
  EXPECT_EQ(report["step_latency_ms"]["count"], 10);  // One message per round.
  EXPECT_GT(report["tokens_per_s"].get<double>(), 0);
  EXPECT_GT(report["step_latency_ms"]["p50"].get<double>(), 0);
  EXPECT_LE(report["step_latency_ms"]["p50"].get<double>(),
            report["step_latency_ms"]["p99"].get<double>());
  EXPECT_GT(report["prefill_s"].get<double>(), 0);
  EXPECT_TRUE(report["errors"].empty());
  // The server computed exactly that: 40 one-row steps, 32 prompt rows; nothing left open.
  const decoding::DecodeStats stats = Stats();
  EXPECT_EQ(stats.decode_tokens, 40);
  EXPECT_EQ(stats.prefill_tokens, 32);
}

// Prompts past --prefill-message-bytes go in several messages (512 bytes a session, two a message:
// two messages on each stream of 4 and 3 sessions): every row is computed.
TEST_F(DecodeCommandsTest, BenchSessionsSplitsPromptsOverPrefillMessages) {
  const CliRun run =
      Run({"bench", "--model", "small", "--sessions", "7", "--clients", "2", "--context", "8",
           "--steps", "3", "--prefill-message-bytes", "1100", "--json", "-q"});
  ASSERT_EQ(run.code, 0) << run.err;
  const nlohmann::json report = nlohmann::json::parse(run.out);
  EXPECT_TRUE(report["errors"].empty());
  EXPECT_EQ(report["decode_tokens"], 21);
  const decoding::DecodeStats stats = Stats();
  EXPECT_EQ(stats.prefill_tokens, 7 * 8);
  EXPECT_EQ(stats.decode_tokens, 21);
}

TEST_F(DecodeCommandsTest, BenchSessionsManyClientsWithALongPromptReportsItsEffect) {
  const CliRun run =
      Run({"bench", "--model", "small", "--sessions", "4", "--clients", "4", "--context", "8",
           "--steps", "10", "--long-prompt-rows", "64", "--long-prompt-at-round", "3"});
  ASSERT_EQ(run.code, 0) << run.err;
  for (const char* line : {"4 sessions on 4 stream(s), context 8, 10 rounds", "steps: 40 tokens in",
                           "long prompt: 64 rows at round 3, answered in",
                           "steps before it:", "steps during it:", "errors: none"}) {
    EXPECT_THAT(run.out, HasSubstr(line));
  }
  const decoding::DecodeStats stats = Stats();
  EXPECT_EQ(stats.decode_tokens, 40);
  EXPECT_EQ(stats.prefill_tokens, 4 * 8 + 64);

  // Before, during and after split the 40 messages (10 rounds of 4 streams).
  const CliRun json =
      Run({"bench", "--model", "small", "--sessions", "4", "--clients", "4", "--context", "8",
           "--steps", "10", "--long-prompt-rows", "64", "--long-prompt-at-round", "3", "--json"});
  ASSERT_EQ(json.code, 0) << json.err;
  const nlohmann::json report = nlohmann::json::parse(json.out);
  const nlohmann::json& long_prompt = report["long_prompt"];
  EXPECT_EQ(long_prompt["steps_before_ms"]["count"].get<int>() +
                long_prompt["steps_during_ms"]["count"].get<int>() +
                long_prompt["steps_after_ms"]["count"].get<int>(),
            40);
  EXPECT_GT(long_prompt["latency_ms"].get<double>(), 0);
}

// The rounds chain on their answers (each sent from the previous one's callback): every stream
// stops at the deadline, and each of its messages was answered and counted.
TEST_F(DecodeCommandsTest, BenchSessionsStopsEveryStreamAtItsDuration) {
  const CliRun run = Run({"bench", "--model", "small", "--sessions", "4", "--clients", "2",
                          "--context", "2", "--steps", "100000000", "--duration", "0.5", "--json"});
  ASSERT_EQ(run.code, 0) << run.err;
  const nlohmann::json report = nlohmann::json::parse(run.out);
  const int64_t messages = report["step_latency_ms"]["count"].get<int64_t>();
  EXPECT_GT(messages, 0);
  EXPECT_EQ(report["decode_tokens"].get<int64_t>(), 2 * messages);  // Two sessions a message.
  EXPECT_TRUE(report["errors"].empty());
  EXPECT_EQ(Stats().decode_tokens, 2 * messages);
  // The streams' sessions close once the server sees the streams end, after the bench returns.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (Stats().sessions_open != 0) {
    ASSERT_LT(std::chrono::steady_clock::now(), give_up) << Stats().sessions_open << " still open";
    std::this_thread::yield();
  }
}

// A server that shuts down mid-run ends every stream: the bench stops (it does not wait for
// rounds that cannot be sent) and reports the failures.
TEST_F(DecodeCommandsTest, BenchSessionsStopsWhenTheServerShutsDown) {
  CliRun run;
  std::thread bench([&] {
    run = Run({"bench", "--model", "small", "--sessions", "4", "--clients", "4", "--context", "2",
               "--steps", "100000000", "--duration", "120"});
  });
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (Stats().decode_tokens < 40) {  // Every stream is stepping.
    ASSERT_LT(std::chrono::steady_clock::now(), give_up);
    std::this_thread::yield();
  }
  StopServer();
  bench.join();
  EXPECT_EQ(run.code, 1);
  EXPECT_THAT(run.err, HasSubstr("decode items failed"));
  // The message in flight ends with the stream (UNAVAILABLE), or the next one is refused because
  // the stream has ended (FAILED_PRECONDITION), whichever the shutdown reaches first.
  EXPECT_THAT(run.out, ContainsRegex("errors (UNAVAILABLE|FAILED_PRECONDITION): [0-9]+"));
}

// A client that disappears without closing anything (its process killed: the connection drops)
// leaves no session and no cache behind.
TEST_F(DecodeCommandsTest, AKilledClientsSessionsAreClosedAndTheirCacheFreed) {
  absl::StatusOr<std::unique_ptr<ChildProcess>> child =
      ChildProcess::Start(ATTNSERVE_CLI_BINARY, {"--target", Target(), "--timeout-s", "30", "bench",
                                                 "--model", "small", "--sessions", "4", "--context",
                                                 "8", "--steps", "1000000", "--duration", "60"});
  ASSERT_TRUE(child.ok()) << child.status();
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (Stats().sessions_open != 4 || Stats().decode_tokens == 0) {  // Stepping.
    ASSERT_LT(std::chrono::steady_clock::now(), give_up) << (*child)->Output();
    std::this_thread::yield();
  }
  ASSERT_GT(Stats().kv_bytes_used, 0);
  (*child)->Signal(SIGKILL);
  (*child)->Wait(absl::Seconds(30));
  decoding::DecodeStats stats = Stats();
  while (stats.sessions_open != 0 || stats.kv_bytes_used != 0 ||
         stats.sessions_closed[static_cast<int>(decoding::CloseReason::kOwnerGone)] != 4) {
    ASSERT_LT(std::chrono::steady_clock::now(), give_up)
        << stats.sessions_open << " sessions, " << stats.kv_bytes_used << " bytes still held";
    std::this_thread::yield();
    stats = Stats();
  }
}

TEST_F(DecodeCommandsTest, BenchSessionsRefusesBadCombinations) {
  CliRun run = Run({"bench", "--model", "small", "--sessions", "4", "--clients", "5"});
  EXPECT_EQ(run.code, 1);
  EXPECT_THAT(run.err, HasSubstr("--clients: expected 1..4"));
  run = Run({"bench", "--model", "small", "--sessions", "4", "--stream"});
  EXPECT_EQ(run.code, 1);
  EXPECT_THAT(run.err, HasSubstr("decode mode"));
  run = Run({"bench", "--model", "small", "--sessions", "2", "--steps", "5", "--long-prompt-rows",
             "8", "--long-prompt-at-round", "5"});
  EXPECT_EQ(run.code, 1);
  EXPECT_THAT(run.err, HasSubstr("--long-prompt-at-round: expected 0..4"));
  run = Run({"bench", "--model", "small", "--sessions", "2", "--prefill-message-bytes", "0"});
  EXPECT_EQ(run.code, 1);
  EXPECT_THAT(run.err, HasSubstr("--prefill-message-bytes: expected >= 1, got 0"));
}

}  // namespace
}  // namespace attnserve::testing
