// attnserve_echo_client: the floor under attnserve's client library. A closed loop of unary
// attnserve.v1 Attend calls made as directly as gRPC's generated callback stub allows: per call
// one AttendRequest whose raw input is copied from the same floats, the answer parsed into an
// AttendResponse by the stub and its size checked — no conversion to the library's types, no
// retry policy, no deadlines. Against attnserve_echo_server its CPU per request is what gRPC and
// protobuf alone cost a client for those bytes: run_echo_floor.sh sets attnserve-cli's beside it.
//
// Prints one JSON object: {"ok", "errors", "elapsed_s", "requests_per_s", "client_cpu_s", ...}.
// Exit status 1 if any call failed.
#include <grpcpp/grpcpp.h>
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "attnserve/v1/attention.grpc.pb.h"
#include "core/util/reuse_large_allocations.h"

namespace {

namespace v1 = attnserve::v1;
using Clock = std::chrono::steady_clock;

struct Flags {
  std::string target = "127.0.0.1:50051";
  int64_t seq_len = 16;
  int64_t d_model = 512;
  int concurrency = 8;
  double duration_s = 8;
  int64_t warmup_requests = 100;
};

double CpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const auto seconds = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

// `concurrency` calls in flight; each answer sends the next until the phase's end, then the
// loop waits for the calls still out.
class Loop {
 public:
  Loop(v1::AttentionService::Stub* stub, const Flags& flags)
      : stub_(stub), flags_(flags), input_(static_cast<size_t>(flags.seq_len * flags.d_model)) {
    for (size_t i = 0; i < input_.size(); ++i) input_[i] = static_cast<float>(i % 97) / 97.0f;
  }

  // Runs until `requests` answers (if > 0) or `duration_s` (if > 0); returns {ok, errors}.
  std::pair<int64_t, int64_t> Run(int64_t requests, double duration_s) {
    ok_ = errors_ = started_ = 0;
    requests_ = requests;
    end_ = duration_s > 0 ? Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                               std::chrono::duration<double>(duration_s))
                          : Clock::time_point::max();
    for (int i = 0; i < flags_.concurrency; ++i) Send();
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [this] { return in_flight_ == 0; });
    return {ok_.load(), errors_.load()};
  }

 private:
  struct Call {
    grpc::ClientContext context;
    v1::AttendRequest request;
    v1::AttendResponse response;
  };

  void Send() {
    if ((requests_ > 0 && started_.fetch_add(1) >= requests_) || Clock::now() >= end_) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++in_flight_;
    }
    auto* call = new Call;
    v1::Tensor* input = call->request.mutable_input();
    input->add_shape(flags_.seq_len);
    input->add_shape(flags_.d_model);
    input->set_raw(reinterpret_cast<const char*>(input_.data()), input_.size() * sizeof(float));
    call->request.set_raw_output(true);
    stub_->async()->Attend(&call->context, &call->request, &call->response,
                           [this, call](grpc::Status status) { Answered(call, status); });
  }

  void Answered(Call* call, const grpc::Status& status) {
    const bool ok =
        status.ok() && call->response.output().raw().size() == input_.size() * sizeof(float);
    (ok ? ok_ : errors_).fetch_add(1);
    delete call;
    Send();
    std::lock_guard<std::mutex> lock(mu_);
    if (--in_flight_ == 0) done_.notify_all();
  }

  v1::AttentionService::Stub* const stub_;
  const Flags flags_;
  std::vector<float> input_;
  std::atomic<int64_t> ok_{0}, errors_{0}, started_{0};
  int64_t requests_ = 0;
  Clock::time_point end_;
  std::mutex mu_;
  std::condition_variable done_;
  int in_flight_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  attnserve::ReuseLargeAllocations();  // As attnserve-cli does.
  Flags flags;
  CLI::App app{
      "attnserve_echo_client: unary Attend calls on the bare generated stub (the client "
      "library's floor)"};
  app.add_option("--target", flags.target)->capture_default_str();
  app.add_option("--seq-len", flags.seq_len)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--d-model", flags.d_model)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--concurrency", flags.concurrency)
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--duration-s", flags.duration_s)
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--warmup-requests", flags.warmup_requests)
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  const std::unique_ptr<v1::AttentionService::Stub> stub = v1::AttentionService::NewStub(
      grpc::CreateCustomChannel(flags.target, grpc::InsecureChannelCredentials(), args));
  Loop loop(stub.get(), flags);
  if (flags.warmup_requests > 0) loop.Run(flags.warmup_requests, 0);
  const double cpu0 = CpuSeconds();
  const Clock::time_point start = Clock::now();
  const auto [ok, errors] = loop.Run(0, flags.duration_s);
  const double elapsed_s = std::chrono::duration<double>(Clock::now() - start).count();
  const double cpu_s = CpuSeconds() - cpu0;
  std::printf(
      "{\"ok\": %lld, \"errors\": %lld, \"elapsed_s\": %.4f, \"requests_per_s\": %.1f, "
      "\"client_cpu_s\": %.4f, \"seq_len\": %lld, \"concurrency\": %d}\n",
      static_cast<long long>(ok), static_cast<long long>(errors), elapsed_s,
      static_cast<double>(ok) / elapsed_s, cpu_s, static_cast<long long>(flags.seq_len),
      flags.concurrency);
  return errors > 0 ? 1 : 0;
}
