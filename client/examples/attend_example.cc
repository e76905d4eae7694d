// attend_example TARGET: lists the server's models, then sends one random [8, d_model] sequence
// to the default model, unary and over a stream, and as a decoding session (a 7-row prompt, then
// one one-row step), and prints what came back.
#include <cmath>
#include <cstdio>
#include <future>
#include <random>
#include <span>
#include <vector>

#include "attnserve/client/client.h"

namespace ac = attnserve::client;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s host:port\n", argv[0]);
    return 2;
  }
  absl::StatusOr<std::unique_ptr<ac::Client>> client = ac::Client::Create(argv[1]);
  if (!client.ok()) {
    std::fprintf(stderr, "%s\n", client.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<ac::ModelInfo> model = (*client)->GetModel("");  // The default model.
  if (!model.ok()) {
    std::fprintf(stderr, "GetModel: %s\n", model.status().ToString().c_str());
    return 1;
  }
  std::printf("model %s: d_model=%d heads=%d\n", model->name.c_str(), model->d_model,
              model->num_heads);

  std::mt19937 rng(42);
  std::normal_distribution<float> normal;
  std::vector<float> input(static_cast<size_t>(8 * model->d_model));
  for (float& x : input) x = normal(rng);
  const ac::TensorView view{input, {8, model->d_model}};

  absl::StatusOr<ac::AttendResult> unary =
      (*client)->Attend(model->name, view, {.mask = ac::Mask::kCausal});
  if (!unary.ok()) {
    std::fprintf(stderr, "Attend: %s\n", unary.status().ToString().c_str());
    return 1;
  }
  std::printf("unary: output [%lld, %lld], first value %.6f, batch of %d sequence(s)\n",
              static_cast<long long>(unary->output.shape[0]),
              static_cast<long long>(unary->output.shape[1]), unary->output.data[0],
              unary->timing.batch_sequences);

  absl::StatusOr<std::unique_ptr<ac::AttendSession>> session = (*client)->OpenSession();
  if (!session.ok()) return 1;
  std::promise<absl::StatusOr<ac::AttendResult>> answer;
  absl::Status sent = (*session)->Attend(
      model->name, view, {.mask = ac::Mask::kCausal},
      [&](absl::StatusOr<ac::AttendResult> result) { answer.set_value(std::move(result)); });
  absl::StatusOr<ac::AttendResult> streamed = answer.get_future().get();
  const absl::Status closed = (*session)->Close();
  if (!sent.ok() || !streamed.ok() || !closed.ok()) {
    std::fprintf(stderr, "stream: %s\n", streamed.status().ToString().c_str());
    return 1;
  }
  std::printf("stream: same answer: %s\n",
              streamed->output.data == unary->output.data ? "yes" : "no");
  if (streamed->output.data != unary->output.data) return 1;

  // A decoding session: the server caches the prompt's K/V, so the last row is sent alone; the
  // outputs are those of the causal forward of all 8 rows.
  absl::StatusOr<std::unique_ptr<ac::DecodeSession>> decode =
      (*client)->OpenDecodeSession({.session = "example", .model = model->name});
  if (!decode.ok()) {
    std::fprintf(stderr, "OpenDecodeSession: %s\n", decode.status().ToString().c_str());
    return 1;
  }
  const int64_t d = model->d_model;
  absl::StatusOr<ac::Tensor> prompt =
      (*decode)->Step({std::span<const float>(input).first(static_cast<size_t>(7 * d)), {7, d}});
  absl::StatusOr<ac::Tensor> last =
      (*decode)->Step({std::span<const float>(input).subspan(static_cast<size_t>(7 * d)), {1, d}});
  if (!prompt.ok() || !last.ok()) {
    std::fprintf(stderr, "decode: %s %s\n", prompt.status().ToString().c_str(),
                 last.status().ToString().c_str());
    return 1;
  }
  std::vector<float> decoded = prompt->data;
  decoded.insert(decoded.end(), last->data.begin(), last->data.end());
  bool same = decoded.size() == unary->output.data.size();
  for (size_t i = 0; same && i < decoded.size(); ++i) {
    same = std::fabs(decoded[i] - unary->output.data[i]) <=
           1e-5f * std::fmax(1.0f, std::fabs(unary->output.data[i]));
  }
  std::printf("decode: same answer as causal Attend: %s\n", same ? "yes" : "no");
  return same && (*decode)->Close().ok() ? 0 : 1;
}
