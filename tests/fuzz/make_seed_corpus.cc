// Writes the fuzzers' seed corpora (tests/fuzz/corpus/<fuzzer>/) with the project's own writers:
// protobuf for AttendRequests, SerializeSafetensors and WeightsToTensors for weight files,
// ModelConfigToJson for config.json. Each fuzzer gets a handful of small valid inputs, one per
// feature its code path branches on, and near-valid ones that fail one check each, so the fuzzer
// starts past the format's basics. Deterministic: rerunning it rewrites the same files.
//
// Usage: attnserve_fuzz_seed_corpus <corpus folder>    (deploy/test-fuzz.sh --seeds runs it)
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "attnserve/v1/attention.pb.h"
#include "core/forward/attention_config.h"
#include "core/forward/attention_weights.h"
#include "core/model/model_config.h"
#include "core/model/safetensors_file.h"
#include "core/model/safetensors_writer.h"
#include "core/model/weight_naming.h"

namespace attnserve::fuzz {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kD = 8;  // The attend_request fuzzer's models have d_model 8.

void Write(const fs::path& path, const std::string& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// --- attend_request ---

void SetTensor(v1::Tensor* tensor, const std::vector<int64_t>& shape, float start, bool raw) {
  int64_t count = 1;
  for (int64_t dim : shape) {
    tensor->add_shape(dim);
    count *= dim;
  }
  std::vector<float> values;
  for (int64_t i = 0; i < count; ++i) values.push_back(start + 0.25f * static_cast<float>(i % 7));
  if (raw) {
    tensor->set_raw(
        std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float)));
  } else {
    tensor->mutable_values()->Add(values.begin(), values.end());
  }
}

void WriteRequests(const fs::path& dir) {
  auto write = [&](const std::string& name, const v1::AttendRequest& request) {
    Write(dir / (name + ".pb"), request.SerializeAsString());
  };
  v1::AttendRequest self;
  SetTensor(self.mutable_input(), {3, kD}, -0.5f, /*raw=*/false);
  write("self_values", self);

  v1::AttendRequest causal;
  causal.set_model("tiny");
  causal.set_request_id("r1");
  SetTensor(causal.mutable_input(), {4, kD}, -0.5f, /*raw=*/true);
  causal.set_mask(v1::MASK_CAUSAL);
  causal.set_raw_output(true);
  write("causal_raw", causal);

  // Every field: a padded batch of two, cross-attention, an explicit mask, a head mask, weights.
  v1::AttendRequest cross;
  SetTensor(cross.mutable_input(), {2, 3, kD}, 0.0f, /*raw=*/true);
  cross.add_lengths(3);
  cross.add_lengths(2);
  SetTensor(cross.mutable_memory(), {2, 4, kD}, 1.0f, /*raw=*/true);
  cross.add_memory_lengths(4);
  cross.add_memory_lengths(1);
  SetTensor(cross.mutable_attn_mask(), {2, 3, 4}, 1.0f, /*raw=*/false);
  cross.add_head_mask(true);
  cross.add_head_mask(false);
  cross.set_return_weights(true);
  write("batch_cross_every_field", cross);

  v1::AttendRequest single;
  single.set_model("single");
  SetTensor(single.mutable_input(), {2, 2, kD}, 0.5f, /*raw=*/false);
  SetTensor(single.mutable_attn_mask(), {2, 2, 2}, 0.0f, /*raw=*/false);
  single.set_mask(v1::MASK_CAUSAL);
  single.set_return_weights(true);
  write("single_head_masked", single);

  // Near-valid: one check fails in each.
  v1::AttendRequest bad = self;
  bad.mutable_input()->set_shape(1, kD - 1);
  write("bad_width", bad);
  bad = cross;
  bad.set_lengths(1, 4);
  write("bad_length", bad);
  bad = self;
  bad.mutable_input()->set_values(5, std::numeric_limits<float>::quiet_NaN());
  write("bad_nan", bad);
  bad = causal;
  bad.mutable_input()->mutable_raw()->pop_back();
  write("bad_raw_size", bad);
  bad = cross;
  bad.mutable_attn_mask()->set_shape(2, 3);
  write("bad_mask_shape", bad);
  bad = self;
  bad.mutable_input()->set_shape(0, 17);
  write("bad_too_long", bad);
}

// --- safetensors ---

void WriteSafetensors(const fs::path& dir) {
  auto write = [&](const std::string& name, const std::vector<model::TensorToWrite>& tensors,
                   const std::map<std::string, std::string>& metadata = {}) {
    absl::StatusOr<std::string> image = model::SerializeSafetensors(tensors, metadata);
    if (!image.ok()) {
      std::fprintf(stderr, "%s: %s\n", name.c_str(), image.status().ToString().c_str());
      std::exit(1);
    }
    Write(dir / (name + ".safetensors"), *image);
  };
  // A whole layer of d_model 4 in each naming, each in another dtype.
  struct Layer {
    const char* name;
    core::AttentionConfig config;
    model::WeightNaming naming;
    model::TensorDtype dtype;
  };
  const Layer layers[] = {
      {"seed_f32_bias",
       {.d_model = 4, .num_heads = 2, .bias = true},
       model::WeightNaming::kSeed,
       model::TensorDtype::kF32},
      {"torch_f16_bias",
       {.d_model = 4, .num_heads = 2, .bias = true},
       model::WeightNaming::kTorch,
       model::TensorDtype::kF16},
      {"split_bf16_single_head",
       {.d_model = 4, .num_heads = 1, .variant = core::AttentionVariant::kSingleHead},
       model::WeightNaming::kSplit,
       model::TensorDtype::kBF16},
  };
  for (const Layer& layer : layers) {
    const std::vector<model::NamedTensor> named = model::WeightsToTensors(
        layer.config, core::MakeRandomWeights(layer.config, 1), layer.naming);
    std::vector<model::TensorToWrite> tensors;
    for (const model::NamedTensor& t : named) {
      tensors.push_back(
          {.name = t.name, .dtype = layer.dtype, .shape = t.shape, .values = t.values});
    }
    write(layer.name, tensors, {{"format", "pt"}});
  }
  const std::vector<float> six = {1, 2, 3, 4, 5, 6};
  write("empty", {});
  write("zero_sized_and_scalar",
        {{.name = "none", .shape = {0, 3}, .values = {}},
         {.name = "one", .shape = {}, .values = {six.data(), 1}},
         {.name = "m", .dtype = model::TensorDtype::kF16, .shape = {2, 3}, .values = six}});

  // Near-valid, by hand: the header length, then the JSON, then the data.
  auto raw = [&](const std::string& name, const std::string& header, const std::string& data) {
    std::string image(8, '\0');
    const uint64_t length = header.size();
    for (int i = 0; i < 8; ++i) image[i] = static_cast<char>((length >> (8 * i)) & 0xff);
    Write(dir / (name + ".safetensors"), image + header + data);
  };
  const std::string eight(8, '\1');
  raw("bad_gap", R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})", eight);
  raw("bad_overlap",
      R"({"a":{"dtype":"I16","shape":[2],"data_offsets":[0,4]},)"
      R"("b":{"dtype":"I32","shape":[1],"data_offsets":[2,6]}})",
      eight);
  raw("bad_shape_bytes", R"({"a":{"dtype":"F64","shape":[2],"data_offsets":[0,8]}})", eight);
  raw("bad_duplicate", R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"a":{}})", eight);
  raw("bad_metadata",
      R"({"__metadata__":{"k":1},"a":{"dtype":"BOOL","shape":[8],)"
      R"("data_offsets":[0,8]}})",
      eight);
}

// --- model_config ---

void WriteConfigs(const fs::path& dir) {
  model::ModelConfig every;
  every.attention = {.d_model = 8, .num_heads = 2, .bias = true};
  every.max_sequence_length = 128;
  every.batching = {.max_batch_sequences = 4,
                    .max_batch_tokens = 64,
                    .max_queue_delay_us = 0,
                    .max_queue_size = 16};
  Write(dir / "every_key.json", model::ModelConfigToJson(every));
  Write(dir / "minimal.json", R"({"d_model": 512, "num_heads": 8})");
  Write(dir / "single_head.json",
        R"({"d_model": 6, "num_heads": 1, "variant": "single_head", "bias": false})");
  Write(dir / "kv_cache_int8.json", R"({"d_model": 8, "num_heads": 2, "kv_cache_dtype": "int8"})");
  Write(dir / "bad_unknown_key.json", R"({"d_model": 8, "num_heads": 2, "heads": 2})");
  Write(dir / "bad_heads.json", R"({"d_model": 8, "num_heads": 3, "dtype": "fp32"})");
  Write(dir / "bad_batching.json",
        R"({"d_model": 8, "num_heads": 2, "batching": {"max_queue_size": 0}})");
  Write(dir / "bad_types.json", R"({"d_model": "8", "num_heads": 2.0, "bias": 1})");
  Write(dir / "bad_duplicate.json", R"({"d_model": 8, "num_heads": 2, "d_model": 16})");
  Write(dir / "bad_number.json", R"({"d_model": 1e400, "num_heads": -0})");
  Write(dir / "bad_deep.json", std::string(65, '[') + std::string(65, ']'));
}

}  // namespace
}  // namespace attnserve::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus folder>\n", argv[0]);
    return 2;
  }
  const std::filesystem::path corpus = argv[1];
  attnserve::fuzz::WriteRequests(corpus / "attend_request");
  attnserve::fuzz::WriteSafetensors(corpus / "safetensors");
  attnserve::fuzz::WriteConfigs(corpus / "model_config");
  return 0;
}
