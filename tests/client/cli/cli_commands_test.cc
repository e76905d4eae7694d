// attnserve-cli's subcommands against a live in-process server on 127.0.0.1 (models "small" and
// "single"), run in-process through RunCli, and the binary itself for health's exit status. The
// server's /metrics page counts what bench really sent.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "attnserve/client/client.h"
#include "client/cli/cli_app.h"
#include "client/cli/npy.h"
#include "client/cli/random_values.h"
#include "nlohmann/json.hpp"
#include "tests/client/cli/cli_test_support.h"
#include "tests/server/metrics/exposition.h"
#include "tests/support/child_process.h"
#include "tests/support/temp_folder.h"

namespace attnserve::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::Not;

class CliCommandsTest : public CliTest {};

TEST_F(CliCommandsTest, ModelsPrintsATableOfEveryModel) {
  const CliRun run = Run({"models"});
  ASSERT_EQ(run.code, 0) << run.err;
  EXPECT_THAT(run.out, HasSubstr("NAME"));
  EXPECT_THAT(run.out, HasSubstr("D_MODEL"));
  EXPECT_THAT(run.out, HasSubstr("small"));
  EXPECT_THAT(run.out, HasSubstr("single"));
  EXPECT_THAT(run.out, HasSubstr("multi_head"));
  EXPECT_THAT(run.out, HasSubstr("single_head"));
  EXPECT_THAT(run.out, HasSubstr("2 models"));
}

TEST_F(CliCommandsTest, InfoPrintsEveryField) {
  const CliRun run = Run({"info", "small"});
  ASSERT_EQ(run.code, 0) << run.err;
  for (const char* field :
       {"name:", "version:", "default:", "d_model:", "num_heads:", "variant:", "bias:", "dtype:",
        "kv_cache_dtype:", "parameter_count:", "max_sequence_length:", "source:",
        "max_batch_sequences:", "max_batch_tokens:", "max_queue_delay_us:", "max_queue_size:"}) {
    EXPECT_THAT(run.out, HasSubstr(field));
  }
  EXPECT_THAT(run.out, HasSubstr("d_model:              16"));
  EXPECT_THAT(run.out, HasSubstr("num_heads:            2"));
  EXPECT_THAT(run.out, HasSubstr("kv_cache_dtype:       fp32"));
  EXPECT_THAT(run.out, HasSubstr("fp32"));
}

TEST_F(CliCommandsTest, InfoOfAnUnknownModelFailsWithNotFound) {
  const CliRun run = Run({"info", "nosuch"});
  EXPECT_EQ(run.code, 1);
  EXPECT_THAT(run.err, HasSubstr("NOT_FOUND"));
  EXPECT_THAT(run.err, HasSubstr("nosuch"));
}

TEST_F(CliCommandsTest, HealthIsZeroWhenServingAndQuietWithQuiet) {
  CliRun run = Run({"health"});
  EXPECT_EQ(run.code, 0) << run.err;
  EXPECT_EQ(run.out, "SERVING\n");
  run = Run({"health", "--quiet"});
  EXPECT_EQ(run.code, 0) << run.err;
  EXPECT_EQ(run.out, "");
  EXPECT_EQ(run.err, "");
  run = Run({"health", "small"});
  EXPECT_EQ(run.code, 0) << run.err;
}

TEST_F(CliCommandsTest, HealthIsOneWithTheReasonOtherwise) {
  CliRun run = Run({"health", "nosuch"});
  EXPECT_EQ(run.code, 1);
  EXPECT_THAT(run.err, HasSubstr("nosuch"));
  StopServer();
  std::ostringstream out, err;
  const int code = cli::RunCli({"--target", Target(), "--timeout-s", "5", "health"}, out, err);
  EXPECT_EQ(code, 1);
  EXPECT_THAT(err.str(), HasSubstr("UNAVAILABLE"));
}

TEST_F(CliCommandsTest, AttendRandomWritesTheLibrarysAnswerToNpy) {
  const std::string out_path = (temp_.path() / "out.npy").string();
  const std::string weights_path = (temp_.path() / "w.npy").string();
  const CliRun run = Run({"attend", "--model", "small", "--random", "5", "--seed", "9", "--mask",
                          "causal", "--out", out_path, "--weights-out", weights_path});
  ASSERT_EQ(run.code, 0) << run.err;
  EXPECT_THAT(run.out, HasSubstr("written to"));
  EXPECT_THAT(run.out, HasSubstr("timing:"));

  absl::StatusOr<client::Tensor> output = cli::ReadNpy(out_path);
  ASSERT_TRUE(output.ok()) << output.status();
  EXPECT_THAT(output->shape, ElementsAre(5, kSmallWidth));
  absl::StatusOr<client::Tensor> weights = cli::ReadNpy(weights_path);
  ASSERT_TRUE(weights.ok()) << weights.status();
  EXPECT_THAT(weights->shape, ElementsAre(kSmallHeads, 5, 5));

  // The same input through the library directly.
  absl::StatusOr<std::unique_ptr<client::Client>> client = client::Client::Create(Target());
  ASSERT_TRUE(client.ok()) << client.status();
  const std::vector<float> input = cli::RandomValues(5 * kSmallWidth, 9);
  client::AttendOptions options;
  options.mask = client::Mask::kCausal;
  options.return_weights = true;
  absl::StatusOr<client::AttendResult> expected =
      (*client)->Attend("small", {input, {5, kSmallWidth}}, options);
  ASSERT_TRUE(expected.ok()) << expected.status();
  EXPECT_THAT(output->data, ElementsAreArray(expected->output.data));
  ASSERT_TRUE(expected->weights.has_value());
  EXPECT_THAT(weights->data, ElementsAreArray(expected->weights->data));
}

TEST_F(CliCommandsTest, AttendReadsNpyInputAndPrintsASummary) {
  const std::string in_path = (temp_.path() / "in.npy").string();
  const std::vector<float> input = cli::RandomValues(2 * 3 * kSingleWidth, 4);
  const std::vector<int64_t> shape = {2, 3, kSingleWidth};
  ASSERT_TRUE(cli::WriteNpy(in_path, input, shape).ok());
  const CliRun run = Run({"attend", "--model", "single", "--input", in_path});
  ASSERT_EQ(run.code, 0) << run.err;
  EXPECT_THAT(run.out, HasSubstr("model single"));
  EXPECT_THAT(run.out, HasSubstr("output [2, 3, 8]"));
  EXPECT_THAT(run.out, HasSubstr("row 0:"));
}

TEST_F(CliCommandsTest, AttendRejectsAnUnsupportedDtypeNamingIt) {
  const std::string in_path = (temp_.path() / "ints.npy").string();
  std::string header = "{'descr': '<i4', 'fortran_order': False, 'shape': (1, 8), }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::ofstream(in_path, std::ios::binary)
      << std::string("\x93NUMPY\x01\x00", 8) << static_cast<char>(header.size())
      << static_cast<char>(0) << header << std::string(32, '\0');
  const CliRun run = Run({"attend", "--model", "single", "--input", in_path});
  EXPECT_EQ(run.code, 1);
  EXPECT_THAT(run.err, HasSubstr("'<i4'"));
}

TEST_F(CliCommandsTest, AttendWireDtypeGivesTheLibrarysSixteenBitAnswer) {
  for (const auto& [name, dtype] : {std::pair{"bf16", client::WireDtype::kBFloat16},
                                    std::pair{"f16", client::WireDtype::kFloat16}}) {
    SCOPED_TRACE(name);
    const std::string out_path = (temp_.path() / absl::StrCat(name, ".npy")).string();
    const CliRun run = Run({"attend", "--model", "small", "--random", "6", "--seed", "3",
                            "--wire-dtype", name, "--out", out_path});
    ASSERT_EQ(run.code, 0) << run.err;
    absl::StatusOr<client::Tensor> output = cli::ReadNpy(out_path);
    ASSERT_TRUE(output.ok()) << output.status();
    absl::StatusOr<std::unique_ptr<client::Client>> client = client::Client::Create(Target());
    ASSERT_TRUE(client.ok()) << client.status();
    const std::vector<float> input = cli::RandomValues(6 * kSmallWidth, 3);
    client::AttendOptions options;
    options.wire_dtype = dtype;
    options.answer_wire_dtype = dtype;
    absl::StatusOr<client::AttendResult> expected =
        (*client)->Attend("small", {input, {6, kSmallWidth}}, options);
    ASSERT_TRUE(expected.ok()) << expected.status();
    EXPECT_THAT(output->data, ElementsAreArray(expected->output.data));
  }
  const CliRun bad = Run({"attend", "--model", "small", "--random", "2", "--wire-dtype", "f64"});
  EXPECT_NE(bad.code, 0);
  EXPECT_THAT(bad.err, HasSubstr("--wire-dtype"));
}

TEST_F(CliCommandsTest, BenchWireDtypeHalvesTheReportedBytes) {
  double request_bytes[2], response_bytes[2];
  int i = 0;
  for (const char* dtype : {"fp32", "bf16"}) {
    const CliRun run = Run({"bench", "--model", "small", "--requests", "20", "--seq-len", "64",
                            "--wire-dtype", dtype, "--json", "-q"});
    ASSERT_EQ(run.code, 0) << run.err << run.out;
    const nlohmann::json report = nlohmann::json::parse(run.out);
    EXPECT_EQ(report["ok"], 20);
    EXPECT_EQ(report["wire_dtype"], dtype);
    request_bytes[i] = report["wire_bytes"]["mean_request"].get<double>();
    response_bytes[i] = report["wire_bytes"]["mean_response"].get<double>();
    ++i;
  }
  EXPECT_GT(request_bytes[0], 64 * kSmallWidth * 4);
  EXPECT_NEAR(request_bytes[1] / request_bytes[0], 0.5, 0.02);
  EXPECT_NEAR(response_bytes[1] / response_bytes[0], 0.5, 0.02);
  const CliRun text =
      Run({"bench", "--model", "small", "--requests", "5", "--wire-dtype", "f16", "-q"});
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("wire:        f16 raw, "));
}

TEST_F(CliCommandsTest, AttendNeedsAnInput) {
  const CliRun run = Run({"attend", "--model", "small"});
  EXPECT_EQ(run.code, 1);
  EXPECT_THAT(run.err, HasSubstr("--random"));
}

TEST_F(CliCommandsTest, Bench200RequestsAllOk) {
  const CliRun run =
      Run({"bench", "--model", "small", "--requests", "200", "--concurrency", "8", "--json", "-q"});
  ASSERT_EQ(run.code, 0) << run.err << run.out;
  const nlohmann::json report = nlohmann::json::parse(run.out);
  EXPECT_EQ(report["requests"], 200);
  EXPECT_EQ(report["ok"], 200);
  EXPECT_TRUE(report["errors"].empty());
  EXPECT_EQ(report["mode"], "closed");
  EXPECT_GT(report["requests_per_s"].get<double>(), 0);
  const double rps = report["requests_per_s"].get<double>();
  EXPECT_NEAR(report["tokens_per_s"].get<double>(), rps * 16, rps * 1e-6);
  EXPECT_GT(report["latency_ms"]["p99.9"].get<double>(), 0);
  EXPECT_GE(report["latency_ms"]["max"].get<double>(), report["latency_ms"]["p50"].get<double>());
  EXPECT_EQ(run.err, "");  // --quiet: no progress line.
}

TEST_F(CliCommandsTest, BenchOverStreamsWithVaryingLengths) {
  const CliRun run = Run({"bench", "--model", "small", "--requests", "200", "--stream", "--streams",
                          "2", "--seq-len", "1:32", "--json", "-q"});
  ASSERT_EQ(run.code, 0) << run.err << run.out;
  const nlohmann::json report = nlohmann::json::parse(run.out);
  EXPECT_EQ(report["ok"], 200);
  EXPECT_TRUE(report["errors"].empty());
  EXPECT_EQ(report["stream"], true);
  EXPECT_EQ(report["seq_len"], "1:32");
}

TEST_F(CliCommandsTest, BenchOpenLoopTextReport) {
  const CliRun run = Run(
      {"bench", "--model", "single", "--requests", "50", "--rate", "500", "--arrival", "fixed"});
  ASSERT_EQ(run.code, 0) << run.err << run.out;
  EXPECT_THAT(run.out, HasSubstr("open loop at 500.0 requests/s (fixed-interval arrivals)"));
  EXPECT_THAT(run.out, HasSubstr("50 (50 ok, 0 errors)"));
  for (const char* field : {"requests/s", "tokens/s", "p50", "p90", "p99 ", "p99.9", "max"}) {
    EXPECT_THAT(run.out, HasSubstr(field));
  }
}

// attnserve_requests_total{code="OK",method=`method`,model="small"} on the server's /metrics.
double OkRequestsOnServer(int metrics_port, const std::string& method) {
  absl::StatusOr<Samples> samples = Scrape(metrics_port);
  EXPECT_TRUE(samples.ok()) << samples.status();
  if (!samples.ok()) return -1;
  return ValueOf(*samples, absl::StrCat("attnserve_requests_total{code=\"OK\",method=\"", method,
                                        "\",model=\"small\"}"));
}

TEST_F(CliCommandsTest, BenchWarmupRequestsAreSentButNotCounted) {
  for (const bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "stream" : "unary");
    const std::string method = stream ? "AttendStream" : "Attend";
    const double before = OkRequestsOnServer(server().metrics_port(), method);
    std::vector<std::string> args = {"bench", "--model",           "small", "--requests",
                                     "20",    "--concurrency",     "4",     "--json",
                                     "-q",    "--warmup-requests", "30"};
    if (stream) args.push_back("--stream");
    const CliRun run = Run(args);
    ASSERT_EQ(run.code, 0) << run.err << run.out;
    const nlohmann::json report = nlohmann::json::parse(run.out);
    EXPECT_EQ(report["requests"], 20);
    EXPECT_EQ(report["ok"], 20);
    EXPECT_EQ(report["warmup_requests"], 30);
    EXPECT_EQ(OkRequestsOnServer(server().metrics_port(), method) - before, 50);
    EXPECT_EQ(run.err, "");
  }
}

// --protocol oip: the same load as ModelInfer calls, counted under the server's ModelInfer method;
// batch_tokens, which the protocol's answer does not carry, is reported absent (null), not 0.
TEST_F(CliCommandsTest, BenchOverModelInfer) {
  const double before = OkRequestsOnServer(server().metrics_port(), "ModelInfer");
  const CliRun run =
      Run({"bench", "--model", "small", "--protocol", "oip", "--requests", "60", "--concurrency",
           "4", "--seq-len", "1:32", "--warmup-requests", "5", "--json", "-q"});
  ASSERT_EQ(run.code, 0) << run.err << run.out;
  const nlohmann::json report = nlohmann::json::parse(run.out);
  EXPECT_EQ(report["protocol"], "oip");
  EXPECT_EQ(report["requests"], 60);
  EXPECT_EQ(report["ok"], 60);
  EXPECT_TRUE(report["errors"].empty());
  EXPECT_EQ(OkRequestsOnServer(server().metrics_port(), "ModelInfer") - before, 65);
  const nlohmann::json& server_figures = report["server"];
  EXPECT_TRUE(server_figures["mean_batch_tokens"].is_null());
  EXPECT_GE(server_figures["mean_batch_sequences"].get<double>(), 1);
  EXPECT_GT(server_figures["mean_compute_us"].get<double>(), 0);
  EXPECT_GT(server_figures["batches"].get<double>(), 0);

  const CliRun text = Run({"bench", "--model", "small", "--protocol", "oip", "--requests", "10",
                           "--rate", "200", "-q"});
  ASSERT_EQ(text.code, 0) << text.err << text.out;
  EXPECT_THAT(text.out, HasSubstr("ModelInfer unary, open loop"));
  EXPECT_THAT(text.out, HasSubstr("n/a tokens"));
  EXPECT_THAT(text.out, HasSubstr("10 (10 ok, 0 errors)"));

  // attnserve.v1 stays the default, with every figure present.
  const CliRun v1 = Run({"bench", "--model", "small", "--requests", "5", "--json", "-q"});
  ASSERT_EQ(v1.code, 0) << v1.err << v1.out;
  const nlohmann::json v1_report = nlohmann::json::parse(v1.out);
  EXPECT_EQ(v1_report["protocol"], "v1");
  EXPECT_GT(v1_report["server"]["mean_batch_tokens"].get<double>(), 0);
}

// --protocol rest / rest-json: the same load as REST infers on the server's HTTP port, counted
// under its RestInfer method, with the server's batch figures read from the answers.
TEST_F(CliCommandsTest, BenchOverRest) {
  const std::string rest_target = absl::StrCat("127.0.0.1:", server().http_port());
  for (const std::string protocol : {"rest", "rest-json"}) {
    // Absent (-1) until the first REST infer.
    const double before = std::max(0.0, OkRequestsOnServer(server().metrics_port(), "RestInfer"));
    const CliRun run = Run({"bench", "--model", "small", "--protocol", protocol, "--rest-target",
                            rest_target, "--requests", "40", "--concurrency", "4", "--seq-len",
                            "1:32", "--warmup-requests", "5", "--mask", "causal", "--json", "-q"});
    ASSERT_EQ(run.code, 0) << run.err << run.out;
    const nlohmann::json report = nlohmann::json::parse(run.out);
    EXPECT_EQ(report["protocol"], protocol);
    EXPECT_EQ(report["ok"], 40);
    EXPECT_TRUE(report["errors"].empty());
    EXPECT_EQ(OkRequestsOnServer(server().metrics_port(), "RestInfer") - before, 45);
    EXPECT_GT(report["server"]["mean_compute_us"].get<double>(), 0);
  }
  // A wrong port: every request fails and the run says so.
  const CliRun refused = Run({"bench", "--model", "small", "--protocol", "rest", "--rest-target",
                              "127.0.0.1:1", "--requests", "3", "-q"});
  EXPECT_EQ(refused.code, 1);
  EXPECT_THAT(refused.err, HasSubstr("3 of 3 requests failed"));
  const CliRun bad = Run({"bench", "--model", "small", "--protocol", "rest", "--rest-target",
                          "nowhere", "--requests", "3", "-q"});
  EXPECT_EQ(bad.code, 1);
  EXPECT_THAT(bad.err, HasSubstr("--rest-target: expected host:port"));
}

TEST_F(CliCommandsTest, BenchProtocolFlagIsCheckedAndRefusesStreams) {
  const CliRun unknown = Run({"bench", "--model", "small", "--protocol", "kserve", "-q"});
  EXPECT_NE(unknown.code, 0);
  EXPECT_THAT(unknown.err, HasSubstr("--protocol"));
  const CliRun stream =
      Run({"bench", "--model", "small", "--protocol", "oip", "--stream", "--requests", "5", "-q"});
  EXPECT_EQ(stream.code, 1);
  EXPECT_THAT(stream.err, HasSubstr("--stream"));
  EXPECT_THAT(stream.err, HasSubstr("--protocol oip"));
  EXPECT_EQ(stream.out, "");
  // ModelInfer's input goes as raw FP32: a 16-bit wire format is refused, not silently ignored.
  const CliRun half = Run({"bench", "--model", "small", "--protocol", "oip", "--wire-dtype", "bf16",
                           "--requests", "5", "-q"});
  EXPECT_EQ(half.code, 1);
  EXPECT_THAT(half.err, HasSubstr("--wire-dtype bf16"));
  EXPECT_THAT(half.err, HasSubstr("expected --wire-dtype fp32"));
  EXPECT_EQ(half.out, "");
}

TEST_F(CliCommandsTest, BenchReportsBatchesComputeBusyAndClientCpu) {
  // Concurrency 1 against a server that releases a batch at once: every batch is one request.
  const CliRun run =
      Run({"bench", "--model", "small", "--requests", "20", "--concurrency", "1", "--json", "-q"});
  ASSERT_EQ(run.code, 0) << run.err << run.out;
  const nlohmann::json report = nlohmann::json::parse(run.out);
  const nlohmann::json& server = report["server"];
  EXPECT_DOUBLE_EQ(server["batches"].get<double>(), 20);
  EXPECT_DOUBLE_EQ(server["batch_mean_sequences"].get<double>(), 1);
  // Σ compute_us over the batches, over the run's wall time; one request per batch, so the mean
  // compute_us times the requests, and one request at a time, so less than the whole time.
  const double busy = server["compute_busy"].get<double>();
  EXPECT_NEAR(
      busy, server["mean_compute_us"].get<double>() * 20 * 1e-6 / report["elapsed_s"].get<double>(),
      1e-9 + busy * 1e-9);
  EXPECT_GE(busy, 0);
  EXPECT_LT(busy, 1);
  EXPECT_GT(report["client_cpu_s"].get<double>(), 0);
  EXPECT_EQ(report["warmup_requests"], 0);

  const CliRun text = Run({"bench", "--model", "small", "--requests", "20", "--concurrency", "1",
                           "--warmup-requests", "5", "-q"});
  ASSERT_EQ(text.code, 0) << text.err << text.out;
  EXPECT_THAT(text.out, HasSubstr("after 5 warm-up requests"));
  EXPECT_THAT(text.out, HasSubstr("batches:     20, 1.00 sequences per batch"));
  EXPECT_THAT(text.out, HasSubstr("client CPU:"));
}

TEST_F(CliCommandsTest, BenchFailsOnAnUnknownModelOrBadOptions) {
  EXPECT_EQ(Run({"bench", "--model", "nosuch", "--requests", "5", "-q"}).code, 1);
  const CliRun bad_len = Run({"bench", "--model", "small", "--seq-len", "9:3", "-q"});
  EXPECT_EQ(bad_len.code, 1);
  EXPECT_THAT(bad_len.err, HasSubstr("--seq-len"));
  const CliRun bad_warmup = Run({"bench", "--model", "small", "--warmup-requests", "-1", "-q"});
  EXPECT_EQ(bad_warmup.code, 1);
  EXPECT_THAT(bad_warmup.err, HasSubstr("--warmup-requests"));
}

TEST_F(CliCommandsTest, GhzDataNeedsNoServer) {
  std::ostringstream out, err;
  EXPECT_EQ(cli::RunCli({"ghz-data", "--model", "small", "--shape", "2,16"}, out, err), 0);
  EXPECT_EQ(nlohmann::json::parse(out.str())["model"], "small");
}

TEST_F(CliCommandsTest, HelpAndUsageErrors) {
  std::ostringstream out, err;
  EXPECT_EQ(cli::RunCli({"--help"}, out, err), 0);
  for (const char* command : {"models", "info", "health", "attend", "bench", "ghz-data"}) {
    EXPECT_THAT(out.str(), HasSubstr(command));
  }
  EXPECT_NE(cli::RunCli({"bench", "--no-such-flag"}, out, err), 0);
  EXPECT_NE(cli::RunCli({}, out, err), 0);
}

// Docker's HEALTHCHECK runs the binary: exit 0 and no output when serving, 1 otherwise.
TEST_F(CliCommandsTest, BinaryHealthExitStatus) {
  absl::StatusOr<std::unique_ptr<ChildProcess>> serving = ChildProcess::Start(
      ATTNSERVE_CLI_BINARY, {"--target", Target(), "--timeout-s", "10", "health", "--quiet"});
  ASSERT_TRUE(serving.ok()) << serving.status();
  EXPECT_EQ((*serving)->Wait(absl::Seconds(30)), 0) << (*serving)->Output();
  EXPECT_EQ((*serving)->Output(), "");

  absl::StatusOr<std::unique_ptr<ChildProcess>> unknown = ChildProcess::Start(
      ATTNSERVE_CLI_BINARY, {"--target", Target(), "--timeout-s", "10", "health", "nosuch"});
  ASSERT_TRUE(unknown.ok()) << unknown.status();
  EXPECT_EQ((*unknown)->Wait(absl::Seconds(30)), 1);
  EXPECT_THAT((*unknown)->Output(), HasSubstr("error:"));
}

}  // namespace
}  // namespace attnserve::testing
