// AttendStream end to end: many messages in flight on one stream, answered by request_id with the
// core's output; bad messages answered in-band while the stream goes on; flow control past the
// per-stream in-flight limit; batching across stream messages; client cancellation; and the
// server's drain closing an idle stream with OK.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "core/util/notification.h"
#include "server/service/attend_stream_reactor.h"
#include "tests/server/service/server_test_support.h"

namespace attnserve::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Stream = grpc::ClientReaderWriter<v1::AttendRequest, v1::AttendResponse>;

// Every stream gets this deadline, so that a bug ends a test instead of hanging it.
constexpr auto kStreamDeadline = std::chrono::seconds(60);
// How long a test waits for something that must happen promptly (a bound, never a sleep).
constexpr absl::Duration kPatience = absl::Seconds(30);

// Opens an AttendStream on `context` (given the stream deadline).
std::unique_ptr<Stream> OpenStream(v1::AttentionService::Stub& stub, grpc::ClientContext* context) {
  context->set_deadline(std::chrono::system_clock::now() + kStreamDeadline);
  return stub.AttendStream(context);
}

// Writes `requests` in order (without reading), then half-closes if `writes_done`, on its own
// thread: the server may stop reading while the client does not read, so writes may block.
class Writer {
 public:
  Writer(Stream* stream, std::vector<v1::AttendRequest> requests, bool writes_done)
      : requests_(std::move(requests)), thread_([this, stream, writes_done] {
          for (const v1::AttendRequest& request : requests_) {
            if (!stream->Write(request)) return;
            ++written_;
          }
          if (writes_done) stream->WritesDone();
          all_written_.Notify();
        }) {}
  ~Writer() { thread_.join(); }

  // True once every request was written (and the stream half-closed, if asked) within `timeout`.
  bool WaitAllWritten(absl::Duration timeout) {
    return all_written_.WaitForNotificationWithTimeout(timeout);
  }
  int written() const { return written_.load(); }

 private:
  const std::vector<v1::AttendRequest> requests_;
  std::atomic<int> written_{0};
  Notification all_written_;
  std::thread thread_;
};

// Reads until the server ends the stream (or `limit` answers), keyed by request_id; fails on a
// duplicate id.
std::map<std::string, v1::AttendResponse> ReadAll(Stream* stream, int limit = 1 << 20) {
  std::map<std::string, v1::AttendResponse> answers;
  v1::AttendResponse response;
  for (int i = 0; i < limit && stream->Read(&response); ++i) {
    const std::string id = response.request_id();
    EXPECT_TRUE(answers.emplace(id, std::move(response)).second) << "duplicate answer " << id;
    response.Clear();
  }
  return answers;
}

std::string StatusText(const grpc::Status& status) {
  return absl::StrCat(status.error_code(), ": ", status.error_message());
}

class StreamTest : public ServerTest {
 protected:
  // Starts the server and keeps its layers, so that answers can be checked after it stopped.
  void Start(server::ServerOptions options = TestServerOptions()) {
    ASSERT_NO_FATAL_FAILURE(StartServer(options));
    for (const std::string model : {kSmallModel, kSingleModel}) layers_[model] = Layer(model);
  }

  // Sends `requests` on a fresh stream while reading, half-closes, and returns every answer by
  // request_id; the stream must end with OK.
  std::map<std::string, v1::AttendResponse> Exchange(
      const std::vector<v1::AttendRequest>& requests) {
    grpc::ClientContext context;
    std::unique_ptr<Stream> stream = OpenStream(stub(), &context);
    std::map<std::string, v1::AttendResponse> answers;
    {
      Writer writer(stream.get(), requests, /*writes_done=*/true);
      answers = ReadAll(stream.get());
      EXPECT_TRUE(writer.WaitAllWritten(kPatience));
    }
    const grpc::Status status = stream->Finish();
    EXPECT_TRUE(status.ok()) << StatusText(status);
    return answers;
  }

  // A self-attention request for `model` of `length` rows, values from `seed`, id `id`.
  static v1::AttendRequest Request(const std::string& model, int64_t length, uint64_t seed,
                                   const std::string& id) {
    const int64_t width = model == kSmallModel ? kSmallWidth : kSingleWidth;
    v1::AttendRequest request = MakeRequest(model, length, width, seed, /*raw=*/seed % 3 == 0);
    request.set_request_id(id);
    request.set_raw_output(seed % 2 == 0);
    return request;
  }

  // `answer` is a successful answer to `request` (made by Request) with the core's output.
  void ExpectAnswers(const v1::AttendRequest& request, const v1::AttendResponse& answer) {
    SCOPED_TRACE(request.request_id());
    ASSERT_FALSE(answer.has_error()) << answer.error().code() << ": " << answer.error().message();
    EXPECT_EQ(answer.request_id(), request.request_id());
    EXPECT_EQ(answer.model(), request.model());
    EXPECT_EQ(answer.output().raw().empty(), !request.raw_output());
    const std::vector<int64_t> shape = TensorShape(request.input());
    EXPECT_EQ(TensorShape(answer.output()), shape);
    EXPECT_GE(answer.timing().batch_sequences(), 1);
    const std::vector<float> expected =
        CoreCompute(*layers_.at(request.model()), {.query = TensorValues(request.input())}).output;
    EXPECT_TRUE(Near(TensorValues(answer.output()), expected));
  }

  // Every request has exactly one successful, correct answer.
  void ExpectAllAnswered(const std::vector<v1::AttendRequest>& requests,
                         const std::map<std::string, v1::AttendResponse>& answers) {
    EXPECT_EQ(answers.size(), requests.size());
    for (const v1::AttendRequest& request : requests) {
      auto it = answers.find(request.request_id());
      if (it == answers.end()) {
        ADD_FAILURE() << "no answer to " << request.request_id();
        continue;
      }
      ExpectAnswers(request, it->second);
    }
  }

  // A unary request succeeds with the core's answer.
  void ExpectUnaryServed() {
    const v1::AttendRequest request = Request(kSmallModel, 3, 1000, "unary");
    v1::AttendResponse response;
    const grpc::Status status = Attend(request, &response);
    ASSERT_TRUE(status.ok()) << StatusText(status);
    ExpectAnswers(request, response);
  }

 private:
  std::map<std::string, std::shared_ptr<const core::AttentionLayer>> layers_;
};

TEST_F(StreamTest, ManyMessagesInFlightAreAllAnsweredByRequestId) {
  Start();
  std::vector<v1::AttendRequest> requests;
  for (int i = 0; i < 40; ++i) {
    const std::string model = i % 5 == 4 ? kSingleModel : kSmallModel;
    requests.push_back(Request(model, 1 + (i * 7) % 20, 100 + i, absl::StrCat("m-", i)));
  }
  const std::map<std::string, v1::AttendResponse> answers = Exchange(requests);
  ExpectAllAnswered(requests, answers);
}

TEST_F(StreamTest, HalfClosingAnEmptyStreamEndsItWithOk) {
  Start();
  grpc::ClientContext context;
  std::unique_ptr<Stream> stream = OpenStream(stub(), &context);
  ASSERT_TRUE(stream->WritesDone());
  v1::AttendResponse response;
  EXPECT_FALSE(stream->Read(&response));
  const grpc::Status status = stream->Finish();
  EXPECT_TRUE(status.ok()) << StatusText(status);
}

TEST_F(StreamTest, BadMessagesAreAnsweredInBandAndTheStreamGoesOn) {
  Start();
  std::vector<v1::AttendRequest> good;
  std::vector<v1::AttendRequest> sent;
  for (int i = 0; i < 9; ++i) {
    if (i == 3) {
      v1::AttendRequest bad = MakeRequest(kSmallModel, 4, 12, 7);  // d_model 12, not 16
      bad.set_request_id("bad-width");
      sent.push_back(bad);
    }
    if (i == 6) {
      v1::AttendRequest unknown = MakeRequest("nope", 4, kSmallWidth, 8);
      unknown.set_request_id("bad-model");
      sent.push_back(unknown);
    }
    good.push_back(Request(kSmallModel, 2 + i, 200 + i, absl::StrCat("g-", i)));
    sent.push_back(good.back());
  }
  std::map<std::string, v1::AttendResponse> answers = Exchange(sent);

  ASSERT_EQ(answers.count("bad-width"), 1u);
  const v1::AttendResponse& bad_width = answers["bad-width"];
  EXPECT_EQ(bad_width.error().code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(bad_width.error().message(), HasSubstr("input.shape[1]"));
  EXPECT_THAT(bad_width.error().message(), HasSubstr("expected d_model 16"));
  EXPECT_THAT(bad_width.error().message(), HasSubstr("got 12"));
  EXPECT_EQ(bad_width.model(), kSmallModel);
  EXPECT_FALSE(bad_width.has_output());
  EXPECT_FALSE(bad_width.has_timing());

  ASSERT_EQ(answers.count("bad-model"), 1u);
  const v1::AttendResponse& bad_model = answers["bad-model"];
  EXPECT_EQ(bad_model.error().code(), static_cast<int>(grpc::StatusCode::NOT_FOUND));
  EXPECT_THAT(bad_model.error().message(), HasSubstr("model"));
  EXPECT_THAT(bad_model.error().message(), HasSubstr("nope"));
  EXPECT_EQ(bad_model.model(), "nope");
  EXPECT_FALSE(bad_model.has_output());

  answers.erase("bad-width");
  answers.erase("bad-model");
  ExpectAllAnswered(good, answers);
}

TEST_F(StreamTest, ClientNotReadingPastTheInFlightLimitIsServedOnceItReads) {
  Start();
  const int count = server::AttendStreamReactor::kMaxInFlightPerStream + 44;
  std::vector<v1::AttendRequest> requests;
  for (int i = 0; i < count; ++i) {
    requests.push_back(Request(kSmallModel, 1 + i % 2, 300 + i, absl::StrCat("f-", i)));
  }
  grpc::ClientContext context;
  std::unique_ptr<Stream> stream = OpenStream(stub(), &context);
  std::map<std::string, v1::AttendResponse> answers;
  {
    Writer writer(stream.get(), requests, /*writes_done=*/true);
    // Nothing is read until every message is written. The server stops reading at the in-flight
    // limit only until its answers are written; these small answers fit the client's HTTP/2
    // window, so the writes complete without the client reading.
    EXPECT_TRUE(writer.WaitAllWritten(kPatience)) << writer.written() << " of " << count;
    answers = ReadAll(stream.get());
  }
  const grpc::Status status = stream->Finish();
  EXPECT_TRUE(status.ok()) << StatusText(status);
  ExpectAllAnswered(requests, answers);
}

TEST_F(StreamTest, MessagesSentBackToBackShareAFullBatch) {
  constexpr int64_t kDelayUs = 5'000'000;
  server::ServerOptions options = TestServerOptions();
  options.model_limits.batching.max_queue_delay_us = kDelayUs;
  options.model_limits.batching.max_batch_sequences = 4;
  Start(options);
  std::vector<v1::AttendRequest> requests;
  int64_t tokens = 0;
  for (int i = 0; i < 4; ++i) {
    v1::AttendRequest request = Request(kSmallModel, 2 + i, 400 + i, absl::StrCat("b-", i));
    request.set_raw_output(false);  // Same batch key for all four.
    tokens += 2 + i;
    requests.push_back(request);
  }
  const std::map<std::string, v1::AttendResponse> answers = Exchange(requests);
  ExpectAllAnswered(requests, answers);
  for (const auto& [id, answer] : answers) {
    SCOPED_TRACE(id);
    EXPECT_EQ(answer.timing().batch_sequences(), 4);
    EXPECT_EQ(answer.timing().batch_tokens(), tokens);
    // Released because it was full, not because the oldest waited out the delay.
    EXPECT_LT(answer.timing().queue_us(), kDelayUs);
  }
}

TEST_F(StreamTest, ClientCancellingMidStreamSeesCancelledAndTheServerGoesOn) {
  Start();
  for (int round = 0; round < 5; ++round) {
    SCOPED_TRACE(round);
    std::vector<v1::AttendRequest> requests;
    for (int i = 0; i < 30; ++i) {
      requests.push_back(
          Request(kSmallModel, 1 + i % 8, 500 + i, absl::StrCat("c-", round, "-", i)));
    }
    grpc::ClientContext context;
    std::unique_ptr<Stream> stream = OpenStream(stub(), &context);
    {
      Writer writer(stream.get(), requests, /*writes_done=*/false);
      v1::AttendResponse response;
      // Cancel after the first answer (round 0: before any), with more messages in flight.
      if (round > 0) {
        ASSERT_TRUE(stream->Read(&response));
      }
      context.TryCancel();
      // The writer stops at its first failed write, if any.
    }
    v1::AttendResponse response;
    while (stream->Read(&response)) {
    }
    const grpc::Status status = stream->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED) << StatusText(status);
    ExpectUnaryServed();
  }
  // Every cancelled stream was finished on the server side: the drain has nothing to wait for.
  Notification stopped;
  std::thread stopper([&] {
    server().Shutdown(absl::Seconds(60));
    stopped.Notify();
  });
  EXPECT_TRUE(stopped.WaitForNotificationWithTimeout(kPatience));
  stopper.join();
}

TEST_F(StreamTest, AClientLeavingWhileReadingIsPausedDoesNotLeaveTheStreamOpen) {
  // Answers are held back 10 s, so the server stops reading at its in-flight limit. Shorter
  // delays let a batch leave the queue before it fills when the machine is slow (TSan on a
  // loaded host read fewer than 256 messages a second), and then the limit is never reached.
  server::ServerOptions options = TestServerOptions();
  options.model_limits.batching.max_queue_delay_us = 10'000'000;
  options.model_limits.batching.max_queue_size = 4096;
  options.model_limits.batching.max_batch_sequences = 4096;
  options.model_limits.batching.max_batch_tokens = 1 << 20;
  Start(options);
  const int limit = server::AttendStreamReactor::kMaxInFlightPerStream;
  std::vector<v1::AttendRequest> requests;
  for (int i = 0; i < limit + 20; ++i) {
    requests.push_back(Request(kSmallModel, 1, 600 + i, absl::StrCat("p-", i)));
  }
  grpc::ClientContext context;
  std::unique_ptr<Stream> stream = OpenStream(stub(), &context);
  {
    Writer writer(stream.get(), requests, /*writes_done=*/false);
    absl::StatusOr<server::ModelRoute> route = server().router().Route(kSmallModel);
    ASSERT_TRUE(route.ok());
    const absl::Time give_up = absl::Now() + kPatience;
    while (route->queue->QueueSize() < limit) {
      ASSERT_LT(absl::Now(), give_up) << "queued " << route->queue->QueueSize();
      std::this_thread::yield();
    }
    EXPECT_EQ(server().service().OpenStreams(), 1);
    context.TryCancel();  // Leaves with 256 messages in flight and the rest unread.
  }
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
  // Once the held-back batch is dropped (its caller is gone), the server finishes the stream.
  const absl::Time give_up = absl::Now() + kPatience;
  while (server().service().OpenStreams() != 0) {
    ASSERT_LT(absl::Now(), give_up) << "the stream is still open on the server";
    std::this_thread::yield();
  }
  ExpectUnaryServed();
}

// The per-stream byte budget: with answers of 512 bytes held back, a budget of 2.5 answers lets
// the server read exactly 3 messages (it reads while under the budget), however many the client
// sends. The drain then answers those 3, and only those: nothing read is lost, nothing more was
// read.
TEST_F(StreamTest, TheServerStopsReadingAStreamAtItsUnsentBytesBudget) {
  constexpr int64_t kLength = 8;
  constexpr int64_t kAnswerBytes = kLength * kSmallWidth * sizeof(float);
  server::ServerOptions options = TestServerOptions();
  options.max_stream_unsent_bytes = kAnswerBytes * 5 / 2;
  options.model_limits.batching.max_queue_delay_us = 60'000'000;
  options.model_limits.batching.max_batch_sequences = 4096;
  options.model_limits.batching.max_batch_tokens = 1 << 20;
  Start(options);
  std::vector<v1::AttendRequest> requests;
  for (int i = 0; i < 20; ++i) {
    requests.push_back(Request(kSmallModel, kLength, 900 + i, absl::StrCat("b-", i)));
  }
  grpc::ClientContext context;
  std::unique_ptr<Stream> stream = OpenStream(stub(), &context);
  std::map<std::string, v1::AttendResponse> answers;
  {
    Writer writer(stream.get(), requests, /*writes_done=*/false);
    absl::StatusOr<server::ModelRoute> route = server().router().Route(kSmallModel);
    ASSERT_TRUE(route.ok());
    const absl::Time give_up = absl::Now() + kPatience;
    while (route->queue->QueueSize() < 3) {
      ASSERT_LT(absl::Now(), give_up) << "queued " << route->queue->QueueSize();
      std::this_thread::yield();
    }
    Notification stopped;
    std::thread stopper([&] {
      server().Shutdown(absl::Seconds(120));
      stopped.Notify();
    });
    answers = ReadAll(stream.get());
    EXPECT_TRUE(stopped.WaitForNotificationWithTimeout(kPatience));
    stopper.join();
  }  // The writer's blocked write fails once the stream is over.
  const grpc::Status status = stream->Finish();
  EXPECT_TRUE(status.ok()) << StatusText(status);
  ASSERT_EQ(answers.size(), 3u);
  EXPECT_EQ(server().service().StreamUnsentBytes(), 0);
  std::vector<v1::AttendRequest> read(requests.begin(), requests.begin() + 3);
  ExpectAllAnswered(read, answers);
}

// The server-wide budget: stream A reads 3 messages (as above, now against the shared budget);
// stream B, with nothing in flight, may still read one, and no more, so no stream waits on
// another's client. The drain answers exactly those 4.
TEST_F(StreamTest, AllStreamsTogetherStopReadingAtTheServersUnsentBytesBudget) {
  constexpr int64_t kLength = 8;
  constexpr int64_t kAnswerBytes = kLength * kSmallWidth * sizeof(float);
  server::ServerOptions options = TestServerOptions();
  options.max_streams_unsent_bytes = kAnswerBytes * 5 / 2;
  options.model_limits.batching.max_queue_delay_us = 60'000'000;
  options.model_limits.batching.max_batch_sequences = 4096;
  options.model_limits.batching.max_batch_tokens = 1 << 20;
  Start(options);
  absl::StatusOr<server::ModelRoute> route = server().router().Route(kSmallModel);
  ASSERT_TRUE(route.ok());
  auto wait_for_queue = [&](int size) {
    const absl::Time give_up = absl::Now() + kPatience;
    while (route->queue->QueueSize() < size) {
      ASSERT_LT(absl::Now(), give_up) << "queued " << route->queue->QueueSize();
      std::this_thread::yield();
    }
  };
  std::vector<v1::AttendRequest> a_requests, b_requests;
  for (int i = 0; i < 10; ++i) {
    a_requests.push_back(Request(kSmallModel, kLength, 950 + i, absl::StrCat("a-", i)));
    b_requests.push_back(Request(kSmallModel, kLength, 970 + i, absl::StrCat("b-", i)));
  }
  grpc::ClientContext a_context, b_context;
  std::unique_ptr<Stream> a = OpenStream(stub(), &a_context);
  std::unique_ptr<Stream> b = OpenStream(stub(), &b_context);
  std::map<std::string, v1::AttendResponse> a_answers, b_answers;
  {
    Writer a_writer(a.get(), a_requests, /*writes_done=*/false);
    ASSERT_NO_FATAL_FAILURE(wait_for_queue(3));
    Writer b_writer(b.get(), b_requests, /*writes_done=*/false);
    ASSERT_NO_FATAL_FAILURE(wait_for_queue(4));
    // A message is queued before its stream books its answer's bytes (once Submit returns).
    const absl::Time give_up = absl::Now() + kPatience;
    while (server().service().StreamUnsentBytes() < 4 * kAnswerBytes) {
      ASSERT_LT(absl::Now(), give_up) << server().service().StreamUnsentBytes();
      std::this_thread::yield();
    }
    EXPECT_EQ(server().service().StreamUnsentBytes(), 4 * kAnswerBytes);
    Notification stopped;
    std::thread stopper([&] {
      server().Shutdown(absl::Seconds(120));
      stopped.Notify();
    });
    a_answers = ReadAll(a.get());
    b_answers = ReadAll(b.get());
    EXPECT_TRUE(stopped.WaitForNotificationWithTimeout(kPatience));
    stopper.join();
  }
  EXPECT_TRUE(a->Finish().ok());
  EXPECT_TRUE(b->Finish().ok());
  ExpectAllAnswered({a_requests.begin(), a_requests.begin() + 3}, a_answers);
  ExpectAllAnswered({b_requests.begin(), b_requests.begin() + 1}, b_answers);
}

// Many streams whose clients send everything before reading anything: the streams pause (the
// servers' unsent-bytes budget), and gRPC buffers at most each stream's window of the uploads
// meanwhile, far below its memory quota; so no stream is reset (RST_STREAM 11 under quota
// pressure) and, once the clients read, every message is answered.
TEST_F(StreamTest, ClientsThatReadLateAreAllAnsweredWithoutAResetStream) {
  constexpr int kStreams = 16;
  constexpr int kMessages = 32;
  // 64 KiB of float32 each way per message, as 16 sequences of 64 rows: the bytes of one
  // 1024-row sequence at a sixteenth of its attention work, so that the test stays well inside
  // the streams' deadline under ThreadSanitizer on slow (AVX2) machines.
  const std::vector<int64_t> lengths(16, 64);
  constexpr int64_t kMessageBytes = 16 * 64 * kSmallWidth * sizeof(float);
  server::ServerOptions options = TestServerOptions();
  options.max_streams_unsent_bytes = 4 * kMessageBytes;
  options.grpc_memory_bytes = 12 << 20;  // Below the 32 MiB the clients send.
  options.grpc_stream_window_bytes = 128 << 10;
  Start(options);
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<Stream>> streams;
  std::vector<std::vector<v1::AttendRequest>> requests(kStreams);
  std::vector<std::unique_ptr<Writer>> writers;
  for (int s = 0; s < kStreams; ++s) {
    for (int m = 0; m < kMessages; ++m) {
      requests[s].push_back(
          MakeBatchedRequest(kSmallModel, lengths, kSmallWidth, 3 * (s * kMessages + m)));
      requests[s].back().set_request_id(absl::StrCat(s, "-", m));
    }
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    streams.push_back(OpenStream(stub(), contexts.back().get()));
    writers.push_back(std::make_unique<Writer>(streams.back().get(), requests[s],
                                               /*writes_done=*/true));
  }
  // Nobody reads for a while: the uploads pile up against the paused streams.
  absl::SleepFor(absl::Milliseconds(500));
  std::vector<std::thread> readers;
  std::vector<std::map<std::string, v1::AttendResponse>> answers(kStreams);
  std::vector<grpc::Status> statuses(kStreams);
  for (int s = 0; s < kStreams; ++s) {
    readers.emplace_back([&, s] {
      answers[s] = ReadAll(streams[s].get());
      statuses[s] = streams[s]->Finish();
    });
  }
  for (std::thread& reader : readers) reader.join();
  writers.clear();
  for (int s = 0; s < kStreams; ++s) {
    SCOPED_TRACE(s);
    EXPECT_TRUE(statuses[s].ok()) << StatusText(statuses[s]);
    EXPECT_EQ(answers[s].size(), requests[s].size());
    for (const auto& [id, answer] : answers[s]) {
      EXPECT_FALSE(answer.has_error()) << id << ": " << answer.error().message();
    }
  }
}

TEST_F(StreamTest, DrainClosesAnIdleStreamWithOkAfterAnsweringEverything) {
  Start();
  std::vector<v1::AttendRequest> requests;
  for (int i = 0; i < 12; ++i) {
    requests.push_back(Request(kSmallModel, 1 + i, 600 + i, absl::StrCat("d-", i)));
  }
  grpc::ClientContext context;
  std::unique_ptr<Stream> stream = OpenStream(stub(), &context);
  for (const v1::AttendRequest& request : requests) ASSERT_TRUE(stream->Write(request));
  // Every message is accepted and answered; the client keeps the stream open (no WritesDone).
  std::map<std::string, v1::AttendResponse> answers = ReadAll(stream.get(), 12);
  ExpectAllAnswered(requests, answers);

  // A grace period far longer than the test's patience: if the drain did not close the idle
  // stream, the stream would be cancelled only at its end and the waits below would fail.
  Notification stopped;
  std::thread stopper([&] {
    server().Shutdown(absl::Seconds(120));
    stopped.Notify();
  });
  v1::AttendResponse extra;
  EXPECT_FALSE(stream->Read(&extra)) << "unexpected answer " << extra.request_id();
  const grpc::Status status = stream->Finish();
  EXPECT_TRUE(status.ok()) << StatusText(status);
  EXPECT_TRUE(stopped.WaitForNotificationWithTimeout(kPatience));
  stopper.join();
}

TEST_F(StreamTest, DrainWithMessagesInFlightAnswersEveryAcceptedOneThenEndsWithOk) {
  server::ServerOptions options = TestServerOptions();
  // Some messages wait in the batcher when the drain starts.
  options.model_limits.batching.max_queue_delay_us = 20'000;
  Start(options);
  std::vector<v1::AttendRequest> requests;
  for (int i = 0; i < 40; ++i) {
    requests.push_back(Request(kSmallModel, 1 + i % 10, 700 + i, absl::StrCat("e-", i)));
  }
  grpc::ClientContext context;
  std::unique_ptr<Stream> stream = OpenStream(stub(), &context);
  for (const v1::AttendRequest& request : requests) ASSERT_TRUE(stream->Write(request));
  v1::AttendResponse first;
  ASSERT_TRUE(stream->Read(&first));  // At least one message was accepted.

  Notification stopped;
  std::thread stopper([&] {
    server().Shutdown(absl::Seconds(120));
    stopped.Notify();
  });
  std::map<std::string, v1::AttendResponse> answers = ReadAll(stream.get());
  answers.emplace(first.request_id(), first);
  const grpc::Status status = stream->Finish();
  EXPECT_TRUE(status.ok()) << StatusText(status);
  EXPECT_TRUE(stopped.WaitForNotificationWithTimeout(kPatience));
  stopper.join();

  // Messages read before the drain are answered with the core's output; one read after it began
  // is refused in-band with UNAVAILABLE; one never read gets no answer (the stream still ends
  // OK, so the client knows which ids are missing).
  int served = 0;
  for (const v1::AttendRequest& request : requests) {
    auto it = answers.find(request.request_id());
    if (it == answers.end()) continue;
    if (it->second.has_error()) {
      EXPECT_EQ(it->second.error().code(), static_cast<int>(grpc::StatusCode::UNAVAILABLE))
          << request.request_id() << ": " << it->second.error().message();
      continue;
    }
    ++served;
    ExpectAnswers(request, it->second);
  }
  EXPECT_GE(served, 1);
  EXPECT_LE(answers.size(), requests.size());
}

}  // namespace
}  // namespace attnserve::testing
