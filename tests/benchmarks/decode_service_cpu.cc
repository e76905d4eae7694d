// attnserve_decode_service_cpu: the server's CPU per Decode step message, and which of its threads
// spend it. Drives a running attnserve (pid `--server-pid`, address `--target`) over one Decode
// stream with a raw stub: opens `--sessions` self-attention sessions of the default model with a
// `--context`-row prompt each, warms up, then sends `--messages` messages of one one-row step per
// session, one message in flight at a time, and reads the server's per-thread CPU time
// (/proc/<pid>/task/*/stat, utime + stime) before and after. The sessions are closed and opened
// again (unmeasured) every `--round` messages, so the cached context stays near `--context`. Prints
// wall time per message and server CPU per message, in total and per thread name (gRPC's threads,
// the decoding loop, the compute threads), plus the CPU of threads that ended meanwhile. Run by
// run_decode_service_cpu.sh, which starts the server.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "attnserve/v1/attention.grpc.pb.h"

namespace {

namespace v1 = attnserve::v1;

// CPU seconds (utime + stime) of one /proc stat file; -1 when unreadable (the thread ended).
double StatCpuSeconds(const std::string& path, std::string* name) {
  std::ifstream file(path);
  std::string line;
  if (!std::getline(file, line)) return -1;
  // "tid (comm) state ppid ..." — comm may hold spaces: cut at the last ')'.
  const size_t open = line.find('('), close = line.rfind(')');
  if (open == std::string::npos || close == std::string::npos) return -1;
  if (name != nullptr) *name = line.substr(open + 1, close - open - 1);
  std::istringstream rest(line.substr(close + 2));
  std::string field;
  std::vector<std::string> fields;
  while (rest >> field) fields.push_back(field);
  // After comm: state is field 3, utime field 14, stime field 15 (1-based, proc(5)).
  if (fields.size() < 13) return -1;
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  return (std::stod(fields[11]) + std::stod(fields[12])) / ticks;
}

struct CpuSnapshot {
  double process = 0;                        // Every thread, ended ones included.
  std::map<std::string, double> by_thread;   // tid -> seconds.
  std::map<std::string, std::string> names;  // tid -> comm.
};

CpuSnapshot Snapshot(int pid) {
  CpuSnapshot snapshot;
  const std::string proc = "/proc/" + std::to_string(pid);
  snapshot.process = StatCpuSeconds(proc + "/stat", nullptr);
  std::error_code error;
  for (const auto& task : std::filesystem::directory_iterator(proc + "/task", error)) {
    const std::string tid = task.path().filename().string();
    std::string name;
    const double seconds = StatCpuSeconds(task.path().string() + "/stat", &name);
    if (seconds < 0) continue;  // Ended meanwhile.
    snapshot.by_thread[tid] = seconds;
    snapshot.names[tid] = name;
  }
  return snapshot;
}

v1::Tensor Rows(int64_t rows, int64_t width, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  v1::Tensor tensor;
  tensor.add_shape(rows);
  tensor.add_shape(width);
  for (int64_t i = 0; i < rows * width; ++i) tensor.add_values(u(rng));
  return tensor;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Server CPU per Decode step message"};
  std::string target = "127.0.0.1:50051";
  int pid = 0;
  int64_t sessions = 64, context = 128, messages = 2000, warmup = 32, round = 32, width = 512;
  app.add_option("--target", target, "the server's address");
  app.add_option("--server-pid", pid, "the server's process id")->required();
  app.add_option("--sessions", sessions, "sessions, one one-row step each per message");
  app.add_option("--context", context, "prompt rows per session");
  app.add_option("--messages", messages, "step messages measured");
  app.add_option("--warmup", warmup, "step messages sent before measuring");
  app.add_option("--round", round, "step messages between reopening the sessions");
  app.add_option("--width", width, "the default model's d_model");
  CLI11_PARSE(app, argc, argv);

  grpc::ChannelArguments arguments;
  arguments.SetMaxReceiveMessageSize(-1);  // The prompts' answer: 64 × 128 rows of outputs.
  arguments.SetMaxSendMessageSize(-1);
  auto channel = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), arguments);
  auto stub = v1::AttentionService::NewStub(channel);
  grpc::ClientContext call_context;
  auto stream = stub->Decode(&call_context);
  std::mt19937 rng(7);
  v1::DecodeResponse answer;
  const auto call = [&](const v1::DecodeRequest& request) {
    if (!stream->Write(request) || !stream->Read(&answer) || answer.has_error()) return false;
    for (const auto& step : answer.steps()) {
      if (step.has_error()) {
        std::cerr << "step failed: " << step.error().message() << "\n";
        return false;
      }
    }
    return true;
  };

  // A round: open the sessions with their prompts, `round` measured step messages, close them
  // all; so the cached context stays within [context, context + round) (a session's cache grows
  // by one row per step) and the KV budget is never reached.
  v1::DecodeRequest open, close, step_message;
  for (int64_t s = 0; s < sessions; ++s) {
    const std::string tag = "s" + std::to_string(s);
    open.add_opens()->set_session(tag);
    v1::DecodeStep* prompt = open.add_steps();
    prompt->set_session(tag);
    *prompt->mutable_rows() = Rows(context, width, rng);
    close.add_closes()->set_session(tag);
    v1::DecodeStep* step = step_message.add_steps();
    step->set_session(tag);
    *step->mutable_rows() = Rows(1, width, rng);
  }
  const auto fail = [&](const char* what) {
    stream->WritesDone();
    const grpc::Status status = stream->Finish();
    std::cerr << what << " failed: " << status.error_message() << "\n";
    return 1;
  };
  if (!call(open)) return fail("open");  // Warm-up round, unmeasured.
  for (int64_t i = 0; i < warmup; ++i) {
    if (!call(step_message)) return fail("warm-up step");
  }
  if (!call(close)) return fail("close");

  std::map<std::string, double> used;  // tid -> CPU seconds in measured parts.
  std::map<std::string, std::string> names;
  double total = 0, wall = 0, answer_bytes = 0;
  for (int64_t sent = 0; sent < messages;) {
    if (!call(open)) return fail("open");
    const CpuSnapshot before = Snapshot(pid);
    const auto start = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < round && sent < messages; ++i, ++sent) {
      if (!call(step_message)) return fail("step");
      answer_bytes = static_cast<double>(answer.ByteSizeLong());
    }
    wall += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const CpuSnapshot after = Snapshot(pid);
    if (!call(close)) return fail("close");
    total += after.process - before.process;
    for (const auto& [tid, seconds] : after.by_thread) {
      const auto it = before.by_thread.find(tid);
      used[tid] += seconds - (it == before.by_thread.end() ? 0 : it->second);
      names[tid] = after.names.at(tid);
    }
  }
  stream->WritesDone();
  stream->Finish();

  std::map<std::string, std::pair<double, int>> by_name;  // name -> (seconds, threads)
  double live = 0;
  for (const auto& [tid, seconds] : used) {
    live += seconds;
    auto& entry = by_name[names[tid]];
    entry.first += seconds;
    if (seconds > 0) ++entry.second;
  }
  const double request_bytes = static_cast<double>(step_message.ByteSizeLong());
  std::printf("%lld messages of %lld one-row steps (d %lld; request %.0f B, answer %.0f B)\n",
              static_cast<long long>(messages), static_cast<long long>(sessions),
              static_cast<long long>(width), request_bytes, answer_bytes);
  std::printf("wall per message: %.3f ms (%.0f tokens/s)\n", 1e3 * wall / messages,
              messages * sessions / wall);
  std::printf("server CPU per message: %.3f ms (%.2f cores busy)\n", 1e3 * total / messages,
              total / wall);
  for (const auto& [name, entry] : by_name) {
    if (entry.first <= 0) continue;
    std::printf("  %-16s %.3f ms  (%d threads with CPU)\n", name.c_str(),
                1e3 * entry.first / messages, entry.second);
  }
  std::printf("  %-16s %.3f ms\n", "(ended threads)", 1e3 * (total - live) / messages);
  return 0;
}
