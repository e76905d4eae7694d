// attnserve-models: generate random model folders, check a folder as the server would load it,
// and list a repository. Run with --help.
#include <iostream>
#include <map>
#include <string>

#include "CLI/CLI.hpp"
#include "tools/model_commands.h"

namespace {

using attnserve::core::AttentionVariant;
using attnserve::model::TensorDtype;
using attnserve::model::WeightNaming;
using attnserve::repository::DemoModelPolicy;

int Report(const absl::Status& status) {
  if (status.ok()) return 0;
  std::cerr << "error: " << status.message() << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"attnserve-models: create, check and list attnserve model folders"};
  app.require_subcommand(1);

  attnserve::tools::GenerateOptions gen;
  gen.config.bias = false;
  std::string repository = "models";
  CLI::App* generate = app.add_subcommand("generate", "write a model folder with random weights");
  generate->add_option("--name", gen.name, "model (and folder) name")->required();
  generate->add_option("--model-repository", repository, "repository folder")
      ->capture_default_str();
  generate->add_option("--d-model", gen.config.d_model, "model width")->capture_default_str();
  generate->add_option("--heads", gen.config.num_heads, "number of heads")->capture_default_str();
  generate->add_option("--variant", gen.config.variant, "multi_head or single_head")
      ->transform(CLI::CheckedTransformer(
          std::map<std::string, AttentionVariant>{{"multi_head", AttentionVariant::kMultiHead},
                                                  {"single_head", AttentionVariant::kSingleHead}}))
      ->default_str("multi_head");
  generate->add_flag("--bias", gen.config.bias, "add biases to every projection");
  generate->add_option("--naming", gen.naming, "tensor names: seed, torch or split")
      ->transform(CLI::CheckedTransformer(
          std::map<std::string, WeightNaming>{{"seed", WeightNaming::kSeed},
                                              {"torch", WeightNaming::kTorch},
                                              {"split", WeightNaming::kSplit}}))
      ->default_str("seed");
  generate->add_option("--dtype", gen.dtype, "file dtype: f32, f16 or bf16")
      ->transform(CLI::CheckedTransformer(std::map<std::string, TensorDtype>{
          {"f32", TensorDtype::kF32}, {"f16", TensorDtype::kF16}, {"bf16", TensorDtype::kBF16}}))
      ->default_str("f32");
  generate->add_option("--seed", gen.seed, "random seed")->capture_default_str();
  generate->add_flag("--force", gen.overwrite, "replace an existing model folder");

  std::string folder;
  CLI::App* check = app.add_subcommand("check", "load a model folder as the server would");
  check->add_option("folder", folder, "model folder, e.g. models/demo2")->required();

  attnserve::repository::ModelRepositoryOptions list_options;
  CLI::App* list = app.add_subcommand("list", "load a repository as the server would");
  list->add_option("--model-repository", list_options.root, "repository folder")
      ->capture_default_str();
  list->add_option("--demo-model", list_options.demo_model,
                   "serve the embedded demo model: auto (no repository folder), always, never")
      ->transform(CLI::CheckedTransformer(
          std::map<std::string, DemoModelPolicy>{{"auto", DemoModelPolicy::kWhenNoRepository},
                                                 {"always", DemoModelPolicy::kAlways},
                                                 {"never", DemoModelPolicy::kNever}}))
      ->default_str("auto");

  CLI11_PARSE(app, argc, argv);
  gen.repository = repository;
  if (*generate) return Report(attnserve::tools::GenerateModel(gen, std::cout));
  if (*check) return Report(attnserve::tools::CheckModel(folder, std::cout));
  return Report(attnserve::tools::ListModels(list_options, std::cout));
}
