// The server's /metrics page, scraped over HTTP after a known sequence of calls: exact counter
// values and histogram counts.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/metrics/exposition.h"
#include "tests/server/service/async_call.h"
#include "tests/server/service/server_test_support.h"
#include "tests/support/http_get.h"

namespace attnserve::testing {
namespace {

// "name{labels}" for the sample of `metric` with `labels` (as prometheus-cpp prints them: sorted
// by name).
std::string Series(const std::string& metric, const std::string& labels) {
  return absl::StrCat(metric, "{", labels, "}");
}
std::string Requests(const std::string& code, const std::string& method, const std::string& model) {
  return Series("attnserve_requests_total",
                absl::StrCat("code=\"", code, "\",method=\"", method, "\",model=\"", model, "\""));
}
std::string Count(const std::string& histogram, const std::string& labels) {
  return Series(histogram + "_count", labels);
}

class MetricsScrapeTest : public ServerTest {
 protected:
  Samples ScrapeNow() {
    absl::StatusOr<Samples> samples = Scrape(server().metrics_port());
    EXPECT_TRUE(samples.ok()) << samples.status();
    return samples.ok() ? *samples : Samples();
  }

  grpc::StatusCode AttendCode(const v1::AttendRequest& request) {
    v1::AttendResponse response;
    return Attend(request, &response).error_code();
  }
};

TEST_F(MetricsScrapeTest, CountsEveryRequestByModelMethodAndCode) {
  StartServer();
  ASSERT_GT(server().metrics_port(), 0);
  // Before any request: the models' series exist at zero (the OK ones of Attend, AttendStream
  // and ModelInfer among the requests); the warm-up passes are not counted.
  Samples before = ScrapeNow();
  EXPECT_EQ(ValueOf(before, Series("attnserve_tokens_total", "model=\"small\"")), 0);
  EXPECT_EQ(ValueOf(before, Count("attnserve_batch_sequences", "model=\"small\"")), 0);
  EXPECT_EQ(ValueOf(before, Requests("OK", "Attend", "small")), 0);
  EXPECT_EQ(ValueOf(before, Requests("OK", "AttendStream", "single")), 0);
  EXPECT_EQ(ValueOf(before, Count("attnserve_request_duration_seconds",
                                  "method=\"Attend\",model=\"small\"")),
            0);
  EXPECT_EQ(ValueOf(before, Requests("OK", "ModelInfer", "small")), 0);
  EXPECT_EQ(CountSeries(before, "attnserve_requests_total{"), 6);

  // Three good requests of 2, 3 and 4 rows, one at a time (so three batches).
  for (int64_t rows : {2, 3, 4}) {
    ASSERT_EQ(AttendCode(MakeRequest(kSmallModel, rows, kSmallWidth, rows)), grpc::StatusCode::OK);
  }
  // Two bad inputs (wrong width) and two unknown models.
  EXPECT_EQ(AttendCode(MakeRequest(kSmallModel, 2, kSmallWidth + 1, 1)),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(AttendCode(MakeRequest(kSmallModel, 0, kSmallWidth, 1)),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(AttendCode(MakeRequest("nope", 2, kSmallWidth, 1)), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(AttendCode(MakeRequest("other", 2, kSmallWidth, 1)), grpc::StatusCode::NOT_FOUND);
  // The model RPCs.
  {
    grpc::ClientContext context;
    v1::ListModelsResponse models;
    ASSERT_TRUE(stub().ListModels(&context, v1::ListModelsRequest(), &models).ok());
  }
  for (const char* name : {kSingleModel, "nope"}) {
    grpc::ClientContext context;
    v1::GetModelRequest request;
    request.set_name(name);
    v1::ModelInfo info;
    (void)stub().GetModel(&context, request, &info);
  }
  // A stream: two good messages and one bad, each counted with its own in-band code.
  {
    grpc::ClientContext context;
    auto stream = stub().AttendStream(&context);
    ASSERT_TRUE(stream->Write(MakeRequest(kSingleModel, 5, kSingleWidth, 1)));
    ASSERT_TRUE(stream->Write(MakeRequest(kSingleModel, 1, kSingleWidth + 3, 2)));
    ASSERT_TRUE(stream->Write(MakeRequest(kSingleModel, 6, kSingleWidth, 3)));
    ASSERT_TRUE(stream->WritesDone());
    v1::AttendResponse response;
    int answers = 0;
    while (stream->Read(&response)) ++answers;
    EXPECT_EQ(answers, 3);
    ASSERT_TRUE(stream->Finish().ok());
  }

  const Samples after = ScrapeNow();
  EXPECT_EQ(ValueOf(after, Requests("OK", "Attend", "small")), 3);
  EXPECT_EQ(ValueOf(after, Requests("INVALID_ARGUMENT", "Attend", "small")), 2);
  EXPECT_EQ(ValueOf(after, Requests("NOT_FOUND", "Attend", "<unknown>")), 2);
  EXPECT_EQ(ValueOf(after, Requests("OK", "ListModels", "")), 1);
  EXPECT_EQ(ValueOf(after, Requests("OK", "GetModel", "single")), 1);
  EXPECT_EQ(ValueOf(after, Requests("NOT_FOUND", "GetModel", "<unknown>")), 1);
  EXPECT_EQ(ValueOf(after, Requests("OK", "AttendStream", "single")), 2);
  EXPECT_EQ(ValueOf(after, Requests("INVALID_ARGUMENT", "AttendStream", "single")), 1);
  // Nothing else, but the zeros from the start.
  EXPECT_EQ(ValueOf(after, Requests("OK", "AttendStream", "small")), 0);
  EXPECT_EQ(ValueOf(after, Requests("OK", "Attend", "single")), 0);
  EXPECT_EQ(CountSeries(after, "attnserve_requests_total{"), 12);

  EXPECT_EQ(ValueOf(after, Count("attnserve_request_duration_seconds",
                                 "method=\"Attend\",model=\"small\"")),
            5);
  EXPECT_EQ(ValueOf(after, Count("attnserve_request_duration_seconds",
                                 "method=\"AttendStream\",model=\"single\"")),
            3);
  // Only requests that reached a batch have a queue time; every batch ran alone.
  EXPECT_EQ(ValueOf(after, Count("attnserve_queue_duration_seconds", "model=\"small\"")), 3);
  EXPECT_EQ(ValueOf(after, Count("attnserve_compute_duration_seconds", "model=\"small\"")), 3);
  EXPECT_EQ(ValueOf(after, Count("attnserve_batch_sequences", "model=\"small\"")), 3);
  EXPECT_EQ(ValueOf(after, Series("attnserve_batch_sequences_sum", "model=\"small\"")), 3);
  EXPECT_EQ(ValueOf(after, Series("attnserve_batch_tokens_sum", "model=\"small\"")), 9);
  EXPECT_EQ(ValueOf(after, Series("attnserve_tokens_total", "model=\"small\"")), 9);
  EXPECT_EQ(ValueOf(after, Series("attnserve_tokens_total", "model=\"single\"")), 11);
  // A 2-row batch lands in the le=2 bucket and above, not in le=1.
  EXPECT_EQ(ValueOf(after, Series("attnserve_batch_tokens_bucket", "model=\"small\",le=\"2\"")), 1);
  EXPECT_EQ(ValueOf(after, Series("attnserve_batch_tokens_bucket", "model=\"small\",le=\"1\"")), 0);
  EXPECT_EQ(ValueOf(after, Series("attnserve_batch_tokens_bucket", "model=\"small\",le=\"+Inf\"")),
            3);

  EXPECT_EQ(ValueOf(after, "attnserve_inflight_requests"), 0);
  EXPECT_EQ(ValueOf(after, Series("attnserve_queue_depth", "model=\"small\"")), 0);
  EXPECT_EQ(ValueOf(after, Series("attnserve_model_loaded", "model=\"small\"")), 1);
  EXPECT_EQ(ValueOf(after, Series("attnserve_model_loaded", "model=\"single\"")), 1);
  EXPECT_EQ(
      ValueOf(
          after,
          Series("attnserve_model_info",
                 "compute_dtype=\"fp32\",kv_cache_dtype=\"fp32\",model=\"small\",version=\"1\"")),
      1);
  EXPECT_EQ(ValueOf(after, Series("attnserve_model_load_failures_total", "model=\"small\"")), 0);
  EXPECT_EQ(CountSeries(after, "attnserve_build_info{"), 1);
  EXPECT_GT(ValueOf(after, "process_resident_memory_bytes"), 1e6);
  EXPECT_GT(ValueOf(after, "process_cpu_seconds_total"), 0);
}

TEST_F(MetricsScrapeTest, LatencyHistogramsUseTheDocumentedBuckets) {
  StartServer();
  ASSERT_EQ(AttendCode(MakeRequest(kSmallModel, 2, kSmallWidth, 1)), grpc::StatusCode::OK);
  const Samples samples = ScrapeNow();
  const std::string labels = "method=\"Attend\",model=\"small\"";
  // 50 us * 2^k: the first, one in the middle, the last, then +Inf.
  for (const char* le : {"5e-05", "0.0032", "13.1072", "+Inf"}) {
    EXPECT_GE(ValueOf(samples, Series("attnserve_request_duration_seconds_bucket",
                                      absl::StrCat(labels, ",le=\"", le, "\""))),
              0)
        << le;
  }
  EXPECT_EQ(CountSeries(samples, "attnserve_request_duration_seconds_bucket{" + labels), 20);
  EXPECT_EQ(CountSeries(samples, "attnserve_queue_duration_seconds_bucket{model=\"small\""), 20);
}

TEST_F(MetricsScrapeTest, AFullQueueIsCountedAndTheWaitingRequestIsInFlight) {
  server::ServerOptions options = TestServerOptions();
  // One queue slot, and a batch that waits (up to a minute) for a second sequence.
  options.model_limits.batching.max_queue_delay_us = 60'000'000;
  options.model_limits.batching.max_batch_sequences = 2;
  options.model_limits.batching.max_queue_size = 1;
  StartServer(options);
  AsyncCall waiting(stub(), MakeRequest(kSmallModel, 3, kSmallWidth, 1));
  // Until the first request holds the slot, a second one may still be accepted: wait for it.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  absl::StatusOr<server::ModelRoute> route = server().router().Route(kSmallModel);
  ASSERT_TRUE(route.ok());
  while (route->queue->QueueSize() != 1) {
    ASSERT_LT(std::chrono::steady_clock::now(), give_up);
    std::this_thread::yield();
  }
  EXPECT_EQ(AttendCode(MakeRequest(kSmallModel, 2, kSmallWidth, 2)),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(AttendCode(MakeRequest(kSmallModel, 2, kSmallWidth, 3)),
            grpc::StatusCode::RESOURCE_EXHAUSTED);

  const Samples held = ScrapeNow();
  EXPECT_EQ(ValueOf(held, Requests("RESOURCE_EXHAUSTED", "Attend", "small")), 2);
  EXPECT_EQ(ValueOf(held, Requests("OK", "Attend", "small")), 0);  // Not answered yet.
  EXPECT_EQ(ValueOf(held, Series("attnserve_queue_depth", "model=\"small\"")), 1);
  EXPECT_EQ(ValueOf(held, "attnserve_inflight_requests"), 1);

  // The drain runs the waiting request at once; the metrics are served until the server is gone.
  server().Shutdown(absl::Seconds(30));
  ASSERT_TRUE(waiting.Wait());
  ASSERT_TRUE(waiting.status().ok()) << waiting.status().error_message();
  const Samples drained = ScrapeNow();
  EXPECT_EQ(ValueOf(drained, Requests("OK", "Attend", "small")), 1);
  EXPECT_EQ(ValueOf(drained, "attnserve_inflight_requests"), 0);
  EXPECT_EQ(ValueOf(drained, Count("attnserve_queue_duration_seconds", "model=\"small\"")), 1);
}

TEST_F(MetricsScrapeTest, UnknownModelNamesShareOneSeries) {
  StartServer();
  for (int i = 0; i < 25; ++i) {
    EXPECT_EQ(AttendCode(MakeRequest(absl::StrCat("made-up-", i), 2, kSmallWidth, 1)),
              grpc::StatusCode::NOT_FOUND);
  }
  const Samples samples = ScrapeNow();
  EXPECT_EQ(ValueOf(samples, Requests("NOT_FOUND", "Attend", "<unknown>")), 25);
  // The models' six zero series, and one for all the unknown names.
  EXPECT_EQ(CountSeries(samples, "attnserve_requests_total{"), 7);
  for (const auto& [series, value] : samples) {
    EXPECT_EQ(series.find("made-up"), std::string::npos) << series;
  }
}

TEST_F(MetricsScrapeTest, ABrokenModelFolderIsCountedAsALoadFailure) {
  std::filesystem::create_directories(repository() / "broken");
  std::ofstream(repository() / "broken" / "config.json") << "{not json";
  StartServer();
  const Samples samples = ScrapeNow();
  EXPECT_EQ(ValueOf(samples, Series("attnserve_model_load_failures_total", "model=\"broken\"")), 1);
  EXPECT_EQ(ValueOf(samples, Series("attnserve_model_loaded", "model=\"broken\"")), 0);
  // An info series for each serving model (those with a queue), none for the broken one.
  EXPECT_EQ(CountSeries(samples, "attnserve_model_info{"),
            CountSeries(samples, "attnserve_queue_depth{"));
  for (const auto& [series, value] : samples) {
    EXPECT_FALSE(series.starts_with("attnserve_model_info{") &&
                 series.find("model=\"broken\"") != std::string::npos)
        << series;
  }
  EXPECT_EQ(
      ValueOf(
          samples,
          Series("attnserve_model_info",
                 "compute_dtype=\"fp32\",kv_cache_dtype=\"fp32\",model=\"small\",version=\"1\"")),
      1);
  EXPECT_EQ(ValueOf(samples, Series("attnserve_model_loaded", "model=\"small\"")), 1);
  // A request for it is counted under its own (known) name.
  EXPECT_EQ(AttendCode(MakeRequest("broken", 2, kSmallWidth, 1)), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(ValueOf(ScrapeNow(), Requests("UNAVAILABLE", "Attend", "broken")), 1);
}

// The repository folder replaced by a file while the server polls it: no crash, the failure is
// counted once, and the models loaded before keep serving.
TEST_F(MetricsScrapeTest, AnUnreadableRepositoryIsCountedAndModelsKeepServing) {
  server::ServerOptions options = TestServerOptions();
  options.model_poll_interval_ms = 10;
  StartServer(options);
  const std::filesystem::path moved = repository().string() + ".moved";
  std::filesystem::rename(repository(), moved);
  std::ofstream(repository()) << "not a folder";
  const std::string failures = "attnserve_repository_scan_failures_total";
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (ValueOf(ScrapeNow(), failures) < 1) {
    ASSERT_LT(absl::Now(), give_up) << "the scan failure was never counted";
  }
  EXPECT_EQ(AttendCode(MakeRequest(kSmallModel, 2, kSmallWidth, 1)), grpc::StatusCode::OK);
  EXPECT_EQ(ValueOf(ScrapeNow(), Series("attnserve_model_loaded", "model=\"small\"")), 1);
  EXPECT_EQ(ValueOf(ScrapeNow(), failures), 1);  // Once per episode, not once per poll.
  std::filesystem::remove(repository());
  std::filesystem::rename(moved, repository());
}

// Clients that send half a request and then wait (slowloris) cannot hold /metrics: with five of
// them connected, a scrape still succeeds well within Prometheus' 10 s scrape timeout (CivetWeb
// drops each after the exposer's 1 s read timeout; one thread with a 30 s timeout did not).
TEST_F(MetricsScrapeTest, HalfSentRequestsDoNotHoldUpAScrape) {
  StartServer();
  std::vector<int> slow_clients;
  for (int i = 0; i < 5; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    slow_clients.push_back(fd);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(server().metrics_port()));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    const std::string half = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n";
    ASSERT_EQ(send(fd, half.data(), half.size(), 0), static_cast<ssize_t>(half.size()));
  }
  absl::StatusOr<std::string> body = HttpGet(server().metrics_port(), "/metrics", absl::Seconds(5));
  EXPECT_TRUE(body.ok()) << body.status();
  for (int fd : slow_clients) close(fd);
}

TEST_F(MetricsScrapeTest, AnEmptyAddressTurnsMetricsOff) {
  server::ServerOptions options = TestServerOptions();
  options.metrics_address = "";
  StartServer(options);
  EXPECT_EQ(server().metrics_port(), 0);
  EXPECT_EQ(server().metrics(), nullptr);
  EXPECT_EQ(AttendCode(MakeRequest(kSmallModel, 2, kSmallWidth, 1)), grpc::StatusCode::OK);
}

TEST(MetricsAddressTest, BadOrTakenAddressesFailTheStartNamingTheOption) {
  server::ServerOptions options = TestServerOptions();
  options.repository.root = "/nonexistent-attnserve-repository";
  options.repository.demo_model = repository::DemoModelPolicy::kAlways;
  options.metrics_address = "no-port";
  absl::StatusOr<std::unique_ptr<server::Server>> server = server::Server::Start(options);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(server.status().message(), ::testing::HasSubstr("metrics_address"));

  // Two servers cannot share one metrics port.
  options.metrics_address = "127.0.0.1:0";
  absl::StatusOr<std::unique_ptr<server::Server>> first = server::Server::Start(options);
  ASSERT_TRUE(first.ok()) << first.status();
  options.metrics_address = absl::StrCat("127.0.0.1:", (*first)->metrics_port());
  absl::StatusOr<std::unique_ptr<server::Server>> second = server::Server::Start(options);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(), ::testing::HasSubstr("metrics_address"));
}

}  // namespace
}  // namespace attnserve::testing
