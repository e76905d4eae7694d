// Dynamic batching end to end: concurrent requests share a batch, a full queue is refused at
// once, and requests whose deadline passed or whose caller cancelled are dropped before compute.
//
// Batches are held back with a long max_queue_delay_us, so what forms a batch is either a full
// batch or the test's own action, never timing.
#include <gmock/gmock.h>
#include <grpc/support/time.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "tests/server/service/async_call.h"
#include "tests/server/service/server_test_support.h"

namespace attnserve::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int64_t kLongDelayUs = 60'000'000;

server::ServerOptions HeldBackOptions(int64_t max_batch_sequences, int64_t max_queue_size = 64) {
  server::ServerOptions options = TestServerOptions();
  options.model_limits.batching.max_queue_delay_us = kLongDelayUs;
  options.model_limits.batching.max_batch_sequences = max_batch_sequences;
  options.model_limits.batching.max_queue_size = max_queue_size;
  return options;
}

class BatchingTest : public ServerTest {
 protected:
  // Sends a 3-row request until one takes the only queue slot: the slot's holder (a request
  // whose caller is gone) is dropped by a full queue once the server sees that it may no longer
  // run. A refusal (RESOURCE_EXHAUSTED) comes back at once; the accepted request waits.
  std::unique_ptr<AsyncCall> TakeTheOnlySlot() {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (true) {
      auto next = std::make_unique<AsyncCall>(stub(), MakeRequest(kSmallModel, 3, kSmallWidth, 2));
      if (!next->WaitFor(absl::Seconds(1))) return next;
      EXPECT_EQ(next->status().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
          << next->status().error_message();
      if (std::chrono::steady_clock::now() > give_up) {
        ADD_FAILURE() << "the slot was never freed";
        return next;
      }
    }
  }

  // Drains the server and expects `only` to have run alone: the request that held the slot
  // before it was never computed.
  void ExpectItRanAlone(AsyncCall& only) {
    StopServer();
    ASSERT_TRUE(only.Wait());
    ASSERT_TRUE(only.status().ok()) << only.status().error_message();
    EXPECT_EQ(only.response().timing().batch_sequences(), 1);
    EXPECT_EQ(only.response().timing().batch_tokens(), 3);
  }

  // Waits (bounded) until the model's queue holds `size` requests.
  void WaitForQueueSize(int64_t size) {
    absl::StatusOr<server::ModelRoute> route = server().router().Route(kSmallModel);
    ASSERT_TRUE(route.ok());
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (route->queue->QueueSize() != size) {
      ASSERT_LT(std::chrono::steady_clock::now(), give_up)
          << "queue size " << route->queue->QueueSize() << ", waiting for " << size;
      std::this_thread::yield();
    }
  }
};

TEST_F(BatchingTest, ConcurrentRequestsShareOneBatchAndEachGetsItsOwnAnswer) {
  StartServer(HeldBackOptions(/*max_batch_sequences=*/4));
  const std::vector<int64_t> lengths = {2, 3, 4, 5};
  std::vector<std::unique_ptr<AsyncCall>> calls;
  for (size_t i = 0; i < lengths.size(); ++i) {
    calls.push_back(std::make_unique<AsyncCall>(
        stub(), MakeRequest(kSmallModel, lengths[i], kSmallWidth, 100 + i, /*raw=*/true)));
  }
  // The fourth request fills the batch, which then runs at once despite the long delay.
  for (size_t i = 0; i < calls.size(); ++i) {
    SCOPED_TRACE(i);
    ASSERT_TRUE(calls[i]->Wait());
    ASSERT_TRUE(calls[i]->status().ok()) << calls[i]->status().error_message();
    const v1::Timing& timing = calls[i]->response().timing();
    EXPECT_EQ(timing.batch_sequences(), 4);
    EXPECT_EQ(timing.batch_tokens(), 2 + 3 + 4 + 5);
    EXPECT_TRUE(Near(
        TensorValues(calls[i]->response().output()),
        CoreCompute(*Layer(kSmallModel), {.query = TestValues(lengths[i] * kSmallWidth, 100 + i)})
            .output));
  }
}

TEST_F(BatchingTest, FullQueueIsRefusedAtOnceAndQueuedRequestsStillComplete) {
  StartServer(HeldBackOptions(/*max_batch_sequences=*/64, /*max_queue_size=*/2));
  AsyncCall first(stub(), MakeRequest(kSmallModel, 3, kSmallWidth, 1));
  AsyncCall second(stub(), MakeRequest(kSmallModel, 4, kSmallWidth, 2));
  WaitForQueueSize(2);

  v1::AttendResponse response;
  const grpc::Status refused = Attend(MakeRequest(kSmallModel, 2, kSmallWidth, 3), &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("max_queue_size"));
  EXPECT_THAT(refused.error_message(), HasSubstr("2"));

  StopServer();  // Draining computes the two queued requests as one batch.
  for (AsyncCall* call : {&first, &second}) {
    ASSERT_TRUE(call->Wait());
    ASSERT_TRUE(call->status().ok()) << call->status().error_message();
    EXPECT_EQ(call->response().timing().batch_sequences(), 2);
    EXPECT_EQ(call->response().timing().batch_tokens(), 7);
  }
}

// The server-wide budget of queued request bytes: a request that would pass it is refused at once
// naming --max-queued-bytes, whatever the queue's count limit, and the queued ones still complete.
TEST_F(BatchingTest, QueuedBytesOverTheServersBudgetAreRefusedAtOnce) {
  server::ServerOptions options = HeldBackOptions(/*max_batch_sequences=*/64);
  // Room for 3 + 4 rows of 16 floats (448 bytes), not for 2 more rows (128 bytes).
  options.max_queued_bytes = (3 + 4 + 1) * kSmallWidth * sizeof(float);
  StartServer(options);
  AsyncCall first(stub(), MakeRequest(kSmallModel, 3, kSmallWidth, 1));
  AsyncCall second(stub(), MakeRequest(kSmallModel, 4, kSmallWidth, 2));
  WaitForQueueSize(2);

  v1::AttendResponse response;
  const grpc::Status refused = Attend(MakeRequest(kSmallModel, 2, kSmallWidth, 3), &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("max_queued_bytes (512)"));
  EXPECT_THAT(refused.error_message(), HasSubstr("448 bytes queued"));
  // One row still fits.
  AsyncCall third(stub(), MakeRequest(kSmallModel, 1, kSmallWidth, 4));
  WaitForQueueSize(3);

  StopServer();  // Draining computes the queued requests.
  for (AsyncCall* call : {&first, &second, &third}) {
    ASSERT_TRUE(call->Wait());
    EXPECT_TRUE(call->status().ok()) << call->status().error_message();
  }
}

// The per-model budget (--max-queued-bytes-per-model, or config.json's batching.max_queued_bytes):
// refused at once naming the model and the limit, well under the server-wide budget.
TEST_F(BatchingTest, QueuedBytesOverTheModelsBudgetAreRefusedAtOnce) {
  server::ServerOptions options = HeldBackOptions(/*max_batch_sequences=*/64);
  // Room for 3 rows of 16 floats (192 bytes), not for 2 more (128 bytes).
  options.model_limits.batching.max_queued_bytes = (3 + 1) * kSmallWidth * sizeof(float);
  StartServer(options);
  AsyncCall first(stub(), MakeRequest(kSmallModel, 3, kSmallWidth, 1));
  WaitForQueueSize(1);

  v1::AttendResponse response;
  const grpc::Status refused = Attend(MakeRequest(kSmallModel, 2, kSmallWidth, 2), &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(),
              AllOf(HasSubstr(kSmallModel), HasSubstr("max_queued_bytes (256)"),
                    HasSubstr("192 bytes queued"), HasSubstr("holds 128")));

  StopServer();
  ASSERT_TRUE(first.Wait());
  EXPECT_TRUE(first.status().ok()) << first.status().error_message();
}

TEST_F(BatchingTest, RequestPastItsDeadlineIsNotComputed) {
  StartServer(HeldBackOptions(/*max_batch_sequences=*/2, /*max_queue_size=*/1));
  AsyncCall expired(stub(), MakeRequest(kSmallModel, 7, kSmallWidth, 1),
                    std::chrono::milliseconds(300));
  ASSERT_TRUE(expired.Wait());
  EXPECT_EQ(expired.status().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  std::unique_ptr<AsyncCall> next = TakeTheOnlySlot();
  ExpectItRanAlone(*next);
}

TEST_F(BatchingTest, CancelledRequestIsNotComputed) {
  // The cancellation reaches the server asynchronously; until it does, the request holds the
  // only queue slot.
  StartServer(HeldBackOptions(/*max_batch_sequences=*/2, /*max_queue_size=*/1));
  AsyncCall cancelled(stub(), MakeRequest(kSmallModel, 7, kSmallWidth, 1));
  WaitForQueueSize(1);
  cancelled.Cancel();
  ASSERT_TRUE(cancelled.Wait());
  EXPECT_EQ(cancelled.status().error_code(), grpc::StatusCode::CANCELLED);
  std::unique_ptr<AsyncCall> next = TakeTheOnlySlot();
  ExpectItRanAlone(*next);
}

// gRPC's own deadline() wraps for a deadline past 2262 (int64 nanoseconds since 1970): a client's
// grpc-timeout of centuries must mean "no hurry", not "already expired".
TEST_F(BatchingTest, ADeadlineCenturiesAwayIsNoDeadline) {
  StartServer();
  for (const int64_t years : {1, 300, 11000}) {
    grpc::ClientContext context;
    context.set_deadline(gpr_time_add(gpr_now(GPR_CLOCK_REALTIME),
                                      gpr_time_from_seconds(years * 366 * 86400, GPR_TIMESPAN)));
    v1::AttendResponse response;
    const grpc::Status status =
        stub().Attend(&context, MakeRequest(kSmallModel, 3, kSmallWidth, 1), &response);
    EXPECT_TRUE(status.ok()) << years << " years: " << status.error_message();
  }
}

TEST_F(BatchingTest, IncompatibleRequestsRunInSeparateBatches) {
  StartServer(HeldBackOptions(/*max_batch_sequences=*/2));
  v1::AttendRequest causal = MakeRequest(kSmallModel, 3, kSmallWidth, 1);
  causal.set_mask(v1::MASK_CAUSAL);
  AsyncCall causal_1(stub(), causal);
  AsyncCall plain_1(stub(), MakeRequest(kSmallModel, 4, kSmallWidth, 2));
  causal.set_request_id("second causal");
  AsyncCall causal_2(stub(), causal);
  AsyncCall plain_2(stub(), MakeRequest(kSmallModel, 5, kSmallWidth, 3));
  for (AsyncCall* call : {&causal_1, &causal_2}) {
    ASSERT_TRUE(call->Wait());
    ASSERT_TRUE(call->status().ok()) << call->status().error_message();
    EXPECT_EQ(call->response().timing().batch_tokens(), 6);
    EXPECT_TRUE(Near(
        TensorValues(call->response().output()),
        CoreCompute(*Layer(kSmallModel), {.query = TestValues(3 * kSmallWidth, 1), .causal = true})
            .output));
  }
  for (AsyncCall* call : {&plain_1, &plain_2}) {
    ASSERT_TRUE(call->Wait());
    ASSERT_TRUE(call->status().ok()) << call->status().error_message();
    EXPECT_EQ(call->response().timing().batch_tokens(), 9);
  }
}

}  // namespace
}  // namespace attnserve::testing
