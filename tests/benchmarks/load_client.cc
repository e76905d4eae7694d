#include "tests/benchmarks/load_client.h"

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

namespace attnserve::load {
namespace {

void RecordAnswer(const v1::AttendResponse& response, double latency_ms, LoadRecorder* recorder) {
  const v1::Timing& timing = response.timing();
  recorder->RecordOk(latency_ms, timing.batch_sequences(), timing.batch_tokens(), timing.queue_us(),
                     timing.compute_us());
}

std::chrono::system_clock::time_point DeadlineAfter(std::chrono::milliseconds timeout) {
  return std::chrono::system_clock::now() + timeout;
}

// --- Unary ---------------------------------------------------------------------------------

class UnaryLoad {
 public:
  UnaryLoad(const v1::AttendRequest& request, std::chrono::milliseconds timeout, LoadBudget* budget,
            LoadRecorder* recorder)
      : request_(request), timeout_(timeout), budget_(budget), recorder_(recorder) {}

  void Run(const std::vector<std::unique_ptr<Stub>>& stubs, int concurrency) {
    slots_.reserve(static_cast<size_t>(concurrency));
    for (int i = 0; i < concurrency; ++i) {
      slots_.push_back(std::make_unique<Slot>());
      slots_.back()->stub = stubs[static_cast<size_t>(i) % stubs.size()].get();
    }
    group_.Add(concurrency);
    for (auto& slot : slots_) Next(slot.get());
    group_.Wait();
  }

 private:
  struct Slot {
    Stub* stub = nullptr;
    std::unique_ptr<grpc::ClientContext> context;
    v1::AttendResponse response;
    LoadClock::time_point start;
  };

  // Sends the slot's next call, or retires the slot when the budget is spent. Runs on the
  // caller's thread for the first call, then on gRPC's callback threads.
  void Next(Slot* slot) {
    if (!budget_->TryTake()) {
      group_.Done();
      return;
    }
    slot->context = std::make_unique<grpc::ClientContext>();  // One per call.
    slot->context->set_deadline(DeadlineAfter(timeout_));
    slot->start = LoadClock::now();
    slot->stub->async()->Attend(slot->context.get(), &request_, &slot->response,
                                [this, slot](grpc::Status status) { OnDone(slot, status); });
  }

  void OnDone(Slot* slot, const grpc::Status& status) {
    const double latency_ms = MillisBetween(slot->start, LoadClock::now());
    if (status.ok()) {
      RecordAnswer(slot->response, latency_ms, recorder_);
    } else {
      recorder_->RecordError(status.error_code());
    }
    Next(slot);
  }

  const v1::AttendRequest& request_;
  const std::chrono::milliseconds timeout_;
  LoadBudget* const budget_;
  LoadRecorder* const recorder_;
  std::vector<std::unique_ptr<Slot>> slots_;
  LoadWorkGroup group_;
};

// --- Stream --------------------------------------------------------------------------------

class StreamWorker final : public grpc::ClientBidiReactor<v1::AttendRequest, v1::AttendResponse> {
 public:
  StreamWorker(const v1::AttendRequest& request, int outstanding, LoadBudget* budget,
               LoadRecorder* recorder, LoadWorkGroup* group)
      : request_(request),
        outstanding_(outstanding),
        budget_(budget),
        recorder_(recorder),
        group_(group) {}

  void Start(Stub* stub, std::chrono::milliseconds timeout) {
    context_.set_deadline(DeadlineAfter(timeout));
    stub->async()->AttendStream(&context_, this);
    Actions actions;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (int i = 0; i < outstanding_; ++i) IssueLocked();
      DecideLocked(&actions);
    }
    StartRead(&response_);
    Perform(actions);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // The stream is over; OnDone follows.
    const LoadClock::time_point now = LoadClock::now();
    Actions actions;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = sent_.end();
      try {
        it = sent_.find(std::stoull(response_.request_id()));
      } catch (const std::exception&) {
        // Not one of ours: counted as an error below.
      }
      if (it == sent_.end()) {
        recorder_->RecordError(static_cast<int>(grpc::StatusCode::INTERNAL));
      } else {
        const double latency_ms = MillisBetween(it->second, now);
        sent_.erase(it);
        if (response_.has_error()) {
          recorder_->RecordError(response_.error().code());
        } else {
          RecordAnswer(response_, latency_ms, recorder_);
        }
        IssueLocked();
      }
      DecideLocked(&actions);
    }
    StartRead(&response_);
    Perform(actions);
  }

  void OnWriteDone(bool ok) override {
    Actions actions;
    {
      std::lock_guard<std::mutex> lock(mu_);
      writing_ = false;
      if (!ok) {
        broken_ = true;  // The call is failing; OnDone will report its status.
        return;
      }
      DecideLocked(&actions);
    }
    Perform(actions);
  }

  void OnDone(const grpc::Status& status) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      // Messages that never got an answer fail with the stream's status.
      const int code = status.ok() ? static_cast<int>(grpc::StatusCode::UNKNOWN)
                                   : static_cast<int>(status.error_code());
      for (size_t i = 0; i < sent_.size(); ++i) recorder_->RecordError(code);
      sent_.clear();
    }
    group_->Done();  // Last touch: the owner may destroy this worker now.
  }

 private:
  struct Actions {
    bool write = false;
    bool writes_done = false;
  };

  // Takes one request from the budget and queues it for writing.
  void IssueLocked() {
    if (retired_) return;
    if (!budget_->TryTake()) {
      retired_ = true;
      return;
    }
    const uint64_t id = next_id_++;
    sent_.emplace(id, LoadClock::now());
    to_write_.push_back(id);
  }

  void DecideLocked(Actions* actions) {
    if (broken_ || writes_done_) return;
    if (!writing_ && !to_write_.empty()) {
      request_.set_request_id(std::to_string(to_write_.front()));  // No write in flight.
      to_write_.pop_front();
      writing_ = true;
      actions->write = true;
    } else if (!writing_ && retired_ && sent_.empty()) {
      writes_done_ = true;
      actions->writes_done = true;
    }
  }

  void Perform(const Actions& actions) {
    if (actions.write) StartWrite(&request_);
    if (actions.writes_done) StartWritesDone();
  }

  grpc::ClientContext context_;
  v1::AttendRequest request_;    // A copy of the payload; only request_id changes per message.
  v1::AttendResponse response_;  // The read buffer.
  const int outstanding_;
  LoadBudget* const budget_;
  LoadRecorder* const recorder_;
  LoadWorkGroup* const group_;

  std::mutex mu_;
  uint64_t next_id_ = 0;
  std::unordered_map<uint64_t, LoadClock::time_point> sent_;  // Unanswered: id -> send time.
  std::deque<uint64_t> to_write_;
  bool writing_ = false;
  bool retired_ = false;  // The budget refused: send nothing more.
  bool writes_done_ = false;
  bool broken_ = false;
};

}  // namespace

void RunUnaryLoad(const std::vector<std::unique_ptr<Stub>>& stubs, const v1::AttendRequest& request,
                  int concurrency, std::chrono::milliseconds timeout, LoadBudget* budget,
                  LoadRecorder* recorder) {
  UnaryLoad load(request, timeout, budget, recorder);
  load.Run(stubs, concurrency);
}

void RunStreamLoad(const std::vector<std::unique_ptr<Stub>>& stubs,
                   const v1::AttendRequest& request, int concurrency, int streams,
                   std::chrono::milliseconds timeout, LoadBudget* budget, LoadRecorder* recorder) {
  LoadWorkGroup group;
  std::vector<std::unique_ptr<StreamWorker>> workers;
  for (int i = 0; i < streams; ++i) {
    const int share = concurrency / streams + (i < concurrency % streams ? 1 : 0);
    workers.push_back(std::make_unique<StreamWorker>(request, share, budget, recorder, &group));
  }
  group.Add(streams);
  for (int i = 0; i < streams; ++i) {
    workers[static_cast<size_t>(i)]->Start(stubs[static_cast<size_t>(i) % stubs.size()].get(),
                                           timeout);
  }
  group.Wait();
}

}  // namespace attnserve::load
