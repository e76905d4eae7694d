#include "server/service/drain_gate.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnserve::server {
namespace {

using ::testing::HasSubstr;

// A refusal that records the status it answers with.
DrainGate::Refusal Recording(std::vector<absl::Status>* answers) {
  return [answers](const absl::Status& status) { answers->push_back(status); };
}

TEST(DrainGateTest, WhileServingNothingIsHeld) {
  OpenCalls calls;
  DrainGate gate(&calls);
  std::vector<absl::Status> answers;
  DrainGate::Refusal refusal = Recording(&answers);
  EXPECT_FALSE(gate.draining());
  EXPECT_FALSE(gate.HoldIfDraining(refusal));
  EXPECT_TRUE(answers.empty());
  EXPECT_EQ(calls.held(), 0);
}

TEST(DrainGateTest, RefusalsAreHeldUntilReleasedThenAnsweredUnavailable) {
  OpenCalls calls;
  DrainGate gate(&calls);
  gate.Close();
  std::vector<absl::Status> answers;
  for (int i = 0; i < 3; ++i) {
    calls.Add();
    DrainGate::Refusal refusal = Recording(&answers);
    EXPECT_TRUE(gate.HoldIfDraining(refusal));
  }
  EXPECT_TRUE(answers.empty());
  EXPECT_EQ(calls.held(), 3);
  gate.Release();
  ASSERT_EQ(answers.size(), 3u);
  for (const absl::Status& status : answers) {
    EXPECT_TRUE(absl::IsUnavailable(status)) << status;
    EXPECT_THAT(status.message(), HasSubstr("draining"));
  }
  EXPECT_EQ(calls.held(), 0);
  for (int i = 0; i < 3; ++i) calls.Done();
}

TEST(DrainGateTest, AfterReleaseARefusalIsAnsweredAtOnce) {
  OpenCalls calls;
  DrainGate gate(&calls);
  gate.Close();
  gate.Release();
  std::vector<absl::Status> answers;
  DrainGate::Refusal refusal = Recording(&answers);
  EXPECT_TRUE(gate.HoldIfDraining(refusal));
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_TRUE(absl::IsUnavailable(answers[0]));
  EXPECT_EQ(calls.held(), 0);
}

TEST(DrainGateTest, TheDestructorAnswersWhatIsStillHeld) {
  OpenCalls calls;
  std::vector<absl::Status> answers;
  {
    DrainGate gate(&calls);
    gate.Close();
    DrainGate::Refusal refusal = Recording(&answers);
    EXPECT_TRUE(gate.HoldIfDraining(refusal));
  }
  EXPECT_EQ(answers.size(), 1u);
}

}  // namespace
}  // namespace attnserve::server
