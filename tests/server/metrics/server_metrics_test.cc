#include "server/metrics/server_metrics.h"

#include <cmath>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"
#include "tests/server/metrics/exposition.h"

namespace attnserve::server::metrics {
namespace {

using testing::Samples;
using testing::ValueOf;

Samples Collect(const ServerMetrics& metrics) {
  std::vector<prometheus::MetricFamily> families;
  for (const auto& collectable : metrics.Collectables()) {
    for (prometheus::MetricFamily& family : collectable->Collect()) {
      families.push_back(std::move(family));
    }
  }
  absl::StatusOr<Samples> samples =
      testing::ParseExposition(prometheus::TextSerializer().Serialize(families));
  EXPECT_TRUE(samples.ok()) << samples.status();
  return samples.ok() ? *samples : Samples();
}

ServerMetrics MakeMetrics() {
  return ServerMetrics({.version = "v", .onednn_version = "o", .isa = "i"});
}

TEST(ServerMetricsTest, LatencyBucketsDoubleFrom50MicrosecondsPast10Seconds) {
  const std::vector<double> buckets = LatencyBucketsSeconds();
  ASSERT_EQ(buckets.size(), 19u);
  EXPECT_DOUBLE_EQ(buckets.front(), 50e-6);
  for (size_t i = 1; i < buckets.size(); ++i) EXPECT_DOUBLE_EQ(buckets[i], 2 * buckets[i - 1]);
  EXPECT_GE(buckets.back(), 10.0);
  EXPECT_LT(buckets[buckets.size() - 2], 10.0);
  EXPECT_EQ(BatchSequenceBuckets().back(), 4096);
  EXPECT_EQ(BatchTokenBuckets().back(), 65536);
}

TEST(ServerMetricsTest, NamesEveryStatusCodeAndMethodAsGrpcDoes) {
  EXPECT_EQ(StatusCodeName(grpc::StatusCode::OK), "OK");
  EXPECT_EQ(StatusCodeName(grpc::StatusCode::INVALID_ARGUMENT), "INVALID_ARGUMENT");
  EXPECT_EQ(StatusCodeName(grpc::StatusCode::RESOURCE_EXHAUSTED), "RESOURCE_EXHAUSTED");
  EXPECT_EQ(StatusCodeName(grpc::StatusCode::UNAUTHENTICATED), "UNAUTHENTICATED");
  EXPECT_EQ(StatusCodeName(static_cast<grpc::StatusCode>(99)), "UNKNOWN");
  EXPECT_EQ(MethodName(Method::kAttendStream), "AttendStream");
  EXPECT_EQ(MethodName(Method::kGetModel), "GetModel");
  EXPECT_EQ(MethodName(Method::kDecode), "Decode");
}

TEST(ServerMetricsTest, OnlyRegisteredModelsGetTheirOwnLabel) {
  ServerMetrics metrics = MakeMetrics();
  ModelMetrics& small = metrics.AddModel("small");
  EXPECT_EQ(&metrics.AddModel("small"), &small);
  EXPECT_EQ(&metrics.ForModel("small"), &small);
  EXPECT_EQ(&metrics.ForModel("smal"), &metrics.unknown_model());
  EXPECT_EQ(&metrics.ForModel(""), &metrics.unknown_model());
  EXPECT_EQ(metrics.unknown_model().name(), kUnknownModel);
  EXPECT_EQ(metrics.no_model().name(), "");
}

TEST(ServerMetricsTest, ConcurrentFirstUsesOfAChildCountEveryRequest) {
  ServerMetrics metrics = MakeMetrics();
  ModelMetrics& model = metrics.AddModel("m");
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) {
        model.RecordRequest(Method::kAttend, grpc::StatusCode::OK, 1e-3);
        model.RecordRequest(Method::kAttend, grpc::StatusCode::DEADLINE_EXCEEDED, 2.0);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  const Samples samples = Collect(metrics);
  EXPECT_EQ(ValueOf(samples, "attnserve_requests_total{code=\"OK\",method=\"Attend\",model=\"m\"}"),
            4000);
  EXPECT_EQ(ValueOf(samples,
                    "attnserve_requests_total{code=\"DEADLINE_EXCEEDED\",method=\"Attend\","
                    "model=\"m\"}"),
            4000);
  const std::string duration = "attnserve_request_duration_seconds";
  EXPECT_EQ(ValueOf(samples, duration + "_count{method=\"Attend\",model=\"m\"}"), 8000);
  EXPECT_NEAR(ValueOf(samples, duration + "_sum{method=\"Attend\",model=\"m\"}"),
              4000 * (1e-3 + 2.0), 1e-6);
  // 1 ms is in le=0.0016 and not le=0.0008; 2 s is in le=3.2768 and not le=1.6384.
  EXPECT_EQ(ValueOf(samples, duration + "_bucket{method=\"Attend\",model=\"m\",le=\"0.0008\"}"), 0);
  EXPECT_EQ(ValueOf(samples, duration + "_bucket{method=\"Attend\",model=\"m\",le=\"0.0016\"}"),
            4000);
  EXPECT_EQ(ValueOf(samples, duration + "_bucket{method=\"Attend\",model=\"m\",le=\"1.6384\"}"),
            4000);
  EXPECT_EQ(ValueOf(samples, duration + "_bucket{method=\"Attend\",model=\"m\",le=\"3.2768\"}"),
            8000);
}

TEST(ServerMetricsTest, SnapshotsAreReadAtScrapeTime) {
  ServerMetrics metrics = MakeMetrics();
  int64_t depth = 3;
  metrics.SetSnapshotSource([&] {
    return std::vector<ModelSnapshot>{{.name = "up",
                                       .loaded = true,
                                       .queue_depth = depth,
                                       .version = 4,
                                       .compute_dtype = "bf16",
                                       .kv_cache_dtype = "int8"},
                                      {.name = "down",
                                       .loaded = false,
                                       .queue_depth = 0,
                                       .version = 0,
                                       .compute_dtype = "",
                                       .kv_cache_dtype = ""}};
  });
  Samples samples = Collect(metrics);
  EXPECT_EQ(ValueOf(samples, "attnserve_model_loaded{model=\"up\"}"), 1);
  EXPECT_EQ(ValueOf(samples, "attnserve_model_loaded{model=\"down\"}"), 0);
  EXPECT_EQ(ValueOf(samples, "attnserve_queue_depth{model=\"up\"}"), 3);
  EXPECT_EQ(ValueOf(samples, "attnserve_queue_depth{model=\"down\"}"), -1);  // No batcher.
  EXPECT_EQ(
      ValueOf(samples,
              "attnserve_model_info{compute_dtype=\"bf16\",kv_cache_dtype=\"int8\",model=\"up\","
              "version=\"4\"}"),
      1);
  // Only serving models have an info series.
  for (const auto& [name, value] : samples) {
    EXPECT_EQ(name.find("model=\"down\",version"), std::string::npos) << name;
  }
  depth = 7;
  EXPECT_EQ(ValueOf(Collect(metrics), "attnserve_queue_depth{model=\"up\"}"), 7);
}

TEST(ServerMetricsTest, BuildInfoLoadFailuresAndInflight) {
  ServerMetrics metrics(
      {.version = "1.2.3", .revision = "0123456789ab", .onednn_version = "2.6.3", .isa = "avx2"});
  metrics.CountLoadFailure("broken");
  metrics.CountLoadFailure("broken");
  metrics.RequestStarted();
  metrics.RequestStarted();
  metrics.RequestEnded();
  metrics.CountTlsReloadFailure("private_key");
  metrics.CountTlsReloadFailure("private_key");
  metrics.CountTlsReloadFailure("client_ca");
  const Samples samples = Collect(metrics);
  EXPECT_EQ(ValueOf(samples, "attnserve_tls_reload_failures_total{file=\"private_key\"}"), 2);
  EXPECT_EQ(ValueOf(samples, "attnserve_tls_reload_failures_total{file=\"client_ca\"}"), 1);
  EXPECT_EQ(ValueOf(samples, "attnserve_tls_reload_failures_total{file=\"cert_chain\"}"), 0);
  EXPECT_EQ(
      ValueOf(samples,
              "attnserve_build_info{isa=\"avx2\",native_bf16=\"false\",onednn_version=\"2.6.3\","
              "revision=\"0123456789ab\",version=\"1.2.3\"}"),
      1);
  EXPECT_EQ(ValueOf(samples, "attnserve_model_load_failures_total{model=\"broken\"}"), 2);
  EXPECT_EQ(ValueOf(samples, "attnserve_inflight_requests"), 1);
  EXPECT_GT(ValueOf(samples, "process_resident_memory_bytes"), 0);
}

}  // namespace
}  // namespace attnserve::server::metrics
