#include "client/cli/cli_app.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <memory>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "attnserve/client/client.h"
#include "attnserve/client/infer_client.h"
#include "attnserve/version.h"
#include "client/cli/attend_command.h"
#include "client/cli/bench_command.h"
#include "client/cli/decode_bench_command.h"
#include "client/cli/decode_command.h"
#include "client/cli/ghz_data.h"
#include "client/cli/model_commands.h"
#include "client/cli/rest_infer_client.h"

namespace attnserve::cli {
namespace {

struct GlobalOptions {
  std::string target = "127.0.0.1:50051";
  double timeout_s = 30;
  int max_attempts = 4;
  bool quiet = false;
  std::string tls_ca;
  std::string tls_cert_chain;
  std::string tls_private_key;
  std::string tls_server_name;
};

std::chrono::milliseconds Millis(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
}

int Report(const absl::Status& status, std::ostream& err) {
  if (status.ok()) return 0;
  err << "error: " << status.ToString() << "\n";
  return 1;
}

absl::Status WriteGhzData(const GhzDataOptions& options, const std::string& shape,
                          const std::string& path, std::ostream& out) {
  absl::StatusOr<std::vector<int64_t>> dims = ParseShapeList(shape);
  if (!dims.ok()) return dims.status();
  GhzDataOptions with_shape = options;
  with_shape.shape = *std::move(dims);
  absl::StatusOr<std::string> data = MakeGhzData(with_shape);
  if (!data.ok()) return data.status();
  if (path.empty() || path == "-") {
    out << *data;
    return absl::OkStatus();
  }
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file << *data;
  file.close();
  if (!file) return absl::InternalError(path + ": cannot write");
  return absl::OkStatus();
}

// --wire-dtype: the raw encoding of the tensors sent and of the answer.
void AddWireDtypeOption(CLI::App* command, std::string& name) {
  command
      ->add_option("--wire-dtype", name,
                   "raw encoding of the tensors sent and of the answer: fp32, bf16 or f16 (the "
                   "16-bit types halve the bytes; results are widened back to float32)")
      ->check(CLI::IsMember({"fp32", "bf16", "f16"}))
      ->capture_default_str();
}

// A .npy input `npy_flag` or else `rows_flag` random rows of the model's width; giving both is a
// usage error.
void AddNpyOrRandomRows(CLI::App* command, const std::string& npy_flag, std::string& path,
                        const std::string& npy_help, const std::string& rows_flag, int64_t& rows,
                        const std::string& rows_help) {
  CLI::Option* npy = command->add_option(npy_flag, path, npy_help);
  npy->excludes(command->add_option(rows_flag, rows, rows_help));
}

client::WireDtype WireDtypeNamed(const std::string& name) {
  if (name == "bf16") return client::WireDtype::kBFloat16;
  if (name == "f16") return client::WireDtype::kFloat16;
  return client::WireDtype::kFloat32;
}

}  // namespace

int RunCli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err,
           std::string_view git_revision) {
  CLI::App app{"attnserve-cli: call an attnserve server (models, health, attention, load tests)",
               "attnserve-cli"};
  app.set_version_flag("--version",
                       absl::StrCat("attnserve-cli ", kVersion, " (git ", std::string(git_revision),
                                    ")\ngRPC ", grpc::Version()));
  app.require_subcommand(1);
  // Global options are also accepted after the subcommand: `attnserve-cli health --quiet`.
  app.fallthrough();

  GlobalOptions global;
  app.add_option("--target", global.target, "server address (a gRPC target)")
      ->capture_default_str();
  app.add_option("--timeout-s", global.timeout_s, "deadline of each call, seconds")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-attempts", global.max_attempts,
                 "attempts per call, retries on UNAVAILABLE / RESOURCE_EXHAUSTED included")
      ->capture_default_str()
      ->check(CLI::Range(1, 5));
  // TLS: environment variables too, so a container's HEALTHCHECK and a Kubernetes exec probe can
  // use the same command whether or not the deployment turns TLS on.
  app.add_option("--tls-ca", global.tls_ca,
                 "PEM CA bundle trusted to sign the server's certificate (\"system\" = the "
                 "system's); turns on TLS")
      ->envname("ATTNSERVE_CLI_TLS_CA");
  app.add_option("--tls-cert-chain", global.tls_cert_chain,
                 "PEM certificate chain of this client, for servers requiring mutual TLS")
      ->envname("ATTNSERVE_CLI_TLS_CERT_CHAIN");
  app.add_option("--tls-private-key", global.tls_private_key, "PEM private key of that certificate")
      ->envname("ATTNSERVE_CLI_TLS_PRIVATE_KEY");
  app.add_option("--tls-server-name", global.tls_server_name,
                 "name the server's certificate must carry (default: the target's host)")
      ->envname("ATTNSERVE_CLI_TLS_SERVER_NAME");
  app.add_flag("-q,--quiet", global.quiet,
               "print nothing on success (health) and no progress line (bench)");

  CLI::App* models = app.add_subcommand("models", "list the serving models");

  std::string info_model;
  CLI::App* info = app.add_subcommand("info", "describe one model (every field of GetModel)");
  info->add_option("model", info_model, "model name (default: the server's default model)");

  std::string health_service;
  CLI::App* health = app.add_subcommand(
      "health", "exit 0 when SERVING, 1 otherwise (with the reason); for HEALTHCHECK");
  health->add_option("service", health_service,
                     "\"\" (the server, default), attnserve.v1.AttentionService or a model name");

  AttendCommandOptions attend_options;
  std::string attend_mask = "none";
  CLI::App* attend = app.add_subcommand("attend", "one Attend call with .npy input and output");
  attend->add_option("--model", attend_options.model, "model (default: the server's default)");
  AddNpyOrRandomRows(attend, "--input", attend_options.input_path,
                     ".npy input, [T, D] or [B, T, D], float32 ('<f4') or float64 ('<f8')",
                     "--random", attend_options.random_length,
                     "T random rows of the model's width instead");
  attend->add_option("--mask", attend_mask, "none or causal")
      ->check(CLI::IsMember({"none", "causal"}))
      ->capture_default_str();
  attend->add_flag("--weights", attend_options.weights, "ask for the per-head weights");
  attend->add_option("--out", attend_options.output_path, "write the output to this .npy");
  attend->add_option("--weights-out", attend_options.weights_path,
                     "write the weights to this .npy (implies --weights)");
  attend->add_option("--seed", attend_options.seed, "seed of --random")->capture_default_str();
  std::string attend_wire_dtype = "fp32";
  AddWireDtypeOption(attend, attend_wire_dtype);

  DecodeCommandOptions decode_options;
  CLI::App* decode = app.add_subcommand(
      "decode", "one decoding session (Decode): a prompt, then one-row steps; outputs and timings");
  decode->add_option("--model", decode_options.model, "model (default: the server's default)");
  AddNpyOrRandomRows(decode, "--prompt", decode_options.prompt_path,
                     "prompt .npy [T, D], float32 or float64", "--prompt-rows",
                     decode_options.prompt_rows,
                     "T random prompt rows of the model's width instead");
  AddNpyOrRandomRows(decode, "--memory", decode_options.memory_path,
                     "cross-attention memory .npy [S, D] (default: self-attention)",
                     "--memory-rows", decode_options.memory_rows,
                     "S random cross-attention memory rows instead");
  decode->add_option("--steps", decode_options.steps, "one-row random steps after the prompt")
      ->capture_default_str();
  decode
      ->add_option("--seed", decode_options.seed,
                   "seed of the random rows (prompt: seed, memory: seed+1, steps: seed+2)")
      ->capture_default_str();
  decode->add_option("--out", decode_options.output_path,
                     "write the outputs [T + steps, D] (prompt, then steps) to this .npy");
  std::string decode_wire_dtype = "fp32";
  AddWireDtypeOption(decode, decode_wire_dtype);

  BenchOptions bench_options;
  std::string bench_mask = "none";
  CLI::App* bench = app.add_subcommand("bench", "load test: closed loop, or open loop with --rate");
  bench->add_option("--model", bench_options.model, "model (default: the server's default)");
  bench
      ->add_option("-c,--concurrency", bench_options.concurrency,
                   "closed loop: outstanding requests; open-loop --stream: max in flight per "
                   "stream")
      ->capture_default_str();
  bench
      ->add_option("--rate", bench_options.rate, "open loop: requests per second (0 = closed loop)")
      ->capture_default_str();
  std::string bench_arrival = "poisson";
  bench
      ->add_option("--arrival", bench_arrival,
                   "open-loop arrivals: poisson (exponential gaps) or fixed (constant interval)")
      ->check(CLI::IsMember({"poisson", "fixed"}))
      ->capture_default_str();
  bench->add_option("-n,--requests", bench_options.requests,
                    "stop after this many requests (default 1000 when no --duration)");
  bench->add_option("--duration", bench_options.duration_s, "stop after this many seconds");
  bench
      ->add_option("--warmup-requests", bench_options.warmup_requests,
                   "send this many requests first, with the same load, and leave them out of "
                   "the report")
      ->capture_default_str();
  bench
      ->add_option("--seq-len", bench_options.seq_len,
                   "rows per request: 16 (fixed) or 8:256 (uniform, deterministic for --seed)")
      ->capture_default_str();
  bench->add_option("--seed", bench_options.seed, "seed of the inputs and lengths")
      ->capture_default_str();
  bench->add_option("--mask", bench_mask, "none or causal")
      ->check(CLI::IsMember({"none", "causal"}))
      ->capture_default_str();
  bench->add_flag("--stream", bench_options.stream, "send over AttendStream sessions");
  bench->add_option("--streams", bench_options.streams, "number of streams with --stream")
      ->capture_default_str();
  bench->add_flag("--json", bench_options.json, "print one JSON object instead of text");
  // Decode mode (decoding sessions): --sessions switches it on.
  DecodeBenchOptions decode_bench;
  CLI::Option* bench_sessions =
      bench->add_option("--sessions", decode_bench.sessions,
                        "decode mode: open N decoding sessions, prefill each with --context rows, "
                        "then run --steps rounds of one-row steps");
  bench->add_option("--context", decode_bench.context, "decode mode: prompt rows per session")
      ->capture_default_str();
  bench
      ->add_option("--prefill-message-bytes", decode_bench.prefill_message_bytes,
                   "decode mode: most prompt bytes per prefill message (whole sessions, at least "
                   "one), below the server's --max-message-bytes")
      ->capture_default_str();
  bench->add_option("--steps", decode_bench.steps, "decode mode: rounds of one-row steps")
      ->capture_default_str();
  bench
      ->add_option("--clients", decode_bench.clients,
                   "decode mode: streams the sessions are spread over, each sending one message "
                   "per round for its sessions (1 = one client stepping all sessions at once)")
      ->capture_default_str();
  bench->add_option("--long-prompt-rows", decode_bench.long_prompt_rows,
                    "decode mode: a prompt of this many rows on a separate session mid-run");
  bench->add_option("--long-prompt-at-round", decode_bench.long_prompt_at_round,
                    "decode mode: the round of the first stream that starts the long prompt");
  std::string bench_protocol = "v1";
  bench
      ->add_option("--protocol", bench_protocol,
                   "v1: attnserve.v1 Attend; oip: the Open Inference Protocol's ModelInfer "
                   "(unary only, raw FP32 input); rest / rest-json: its REST infer at "
                   "--rest-target, with binary tensor data or JSON bodies")
      ->check(CLI::IsMember({"v1", "oip", "rest", "rest-json"}))
      ->capture_default_str();
  std::string bench_rest_target;
  bench->add_option("--rest-target", bench_rest_target,
                    "host:port of the server's REST port for --protocol rest (default: the "
                    "target's host, port 8000)");
  std::string bench_wire_dtype = "fp32";
  AddWireDtypeOption(bench, bench_wire_dtype);

  GhzDataOptions ghz_options;
  std::string ghz_shape;
  std::string ghz_out;
  CLI::App* ghz = app.add_subcommand(
      "ghz-data",
      "print ghz call data (JSON) for attnserve.v1.AttentionService/Attend (or Decode)");
  ghz->add_option("--model", ghz_options.model, "model (default: the server's default)");
  ghz->add_option("--shape", ghz_shape, "input shape T,D (or B,T,D)")->required();
  ghz->add_option("--count", ghz_options.count, "1: one object; N > 1: an array of N")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  ghz->add_option("--seed", ghz_options.seed, "object i uses seed + i")->capture_default_str();
  ghz->add_flag("--raw", ghz_options.raw, "input as base64 float32 bytes (Tensor.raw)");
  ghz->add_flag("--raw-output", ghz_options.raw_output, "ask for raw output (smaller answers)");
  ghz->add_flag("--pretty", ghz_options.pretty, "indent the JSON");
  ghz->add_option("--out", ghz_out, "write to this file instead of stdout");
  ghz->add_option("--decode-sessions", ghz_options.decode_sessions,
                  "Decode mode: the messages of one Decode stream (an array): open K sessions "
                  "and prefill each with --shape C,D rows, --decode-steps one-row steps for "
                  "all, then close them");
  ghz->add_option("--decode-steps", ghz_options.decode_steps,
                  "Decode mode: step messages per stream")
      ->capture_default_str();

  try {
    // CLI11 takes the arguments last first.
    std::vector<std::string> reversed(args.rbegin(), args.rend());
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    return app.exit(e, out, err);
  }

  if (*ghz) return Report(WriteGhzData(ghz_options, ghz_shape, ghz_out, out), err);

  client::ClientOptions client_options;
  client_options.default_deadline = Millis(global.timeout_s);
  client_options.max_attempts = global.max_attempts;
  client_options.tls_ca_path = global.tls_ca;
  client_options.tls_cert_chain_path = global.tls_cert_chain;
  client_options.tls_private_key_path = global.tls_private_key;
  client_options.tls_server_name = global.tls_server_name;
  absl::StatusOr<std::unique_ptr<client::Client>> client =
      client::Client::Create(global.target, client_options);
  if (!client.ok()) return Report(client.status(), err);

  if (*models) return Report(ListModelsCommand(**client, out), err);
  if (*info) return Report(InfoCommand(**client, info_model, out), err);
  if (*health) return Report(HealthCommand(**client, health_service, global.quiet, out), err);
  if (*attend) {
    attend_options.causal = attend_mask == "causal";
    attend_options.wire_dtype = WireDtypeNamed(attend_wire_dtype);
    return Report(AttendCommand(**client, attend_options, out), err);
  }
  if (*decode) {
    decode_options.wire_dtype = WireDtypeNamed(decode_wire_dtype);
    return Report(DecodeCommand(**client, decode_options, out), err);
  }
  if (bench_sessions->count() > 0) {
    if (bench_options.stream || bench_options.rate > 0 || bench_protocol != "v1") {
      return Report(absl::InvalidArgumentError(
                        "--sessions (decode mode) sends Decode streams in closed loop: drop "
                        "--stream, --rate and --protocol"),
                    err);
    }
    decode_bench.model = bench_options.model;
    decode_bench.duration_s = bench_options.duration_s;
    decode_bench.seed = bench_options.seed;
    decode_bench.json = bench_options.json;
    decode_bench.wire_dtype = WireDtypeNamed(bench_wire_dtype);
    return Report(DecodeBenchCommand(**client, decode_bench, out), err);
  }
  bench_options.causal = bench_mask == "causal";
  bench_options.wire_dtype = WireDtypeNamed(bench_wire_dtype);
  bench_options.arrival = bench_arrival == "fixed" ? Arrival::kFixed : Arrival::kPoisson;
  bench_options.progress = !global.quiet;
  bench_options.protocol = bench_protocol == "oip"         ? Protocol::kOip
                           : bench_protocol == "rest"      ? Protocol::kRest
                           : bench_protocol == "rest-json" ? Protocol::kRestJson
                                                           : Protocol::kV1;
  std::unique_ptr<client::InferClient> infer;
  if (bench_options.protocol == Protocol::kRest || bench_options.protocol == Protocol::kRestJson) {
    if (bench_rest_target.empty()) {
      bench_rest_target = absl::StrCat(global.target.substr(0, global.target.rfind(':')), ":8000");
    }
    absl::StatusOr<std::unique_ptr<client::InferClient>> created = MakeRestInferClient(
        bench_rest_target,
        bench_options.protocol == Protocol::kRest ? RestBody::kBinary : RestBody::kJson);
    if (!created.ok()) return Report(created.status(), err);
    infer = *std::move(created);
  } else if (bench_options.protocol == Protocol::kOip) {
    absl::StatusOr<std::unique_ptr<client::InferClient>> created =
        client::InferClient::Create(global.target, client_options);
    if (!created.ok()) return Report(created.status(), err);
    infer = *std::move(created);
  }
  return Report(BenchCommand(**client, infer.get(), bench_options, out, err), err);
}

}  // namespace attnserve::cli
