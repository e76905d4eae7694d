// ServerOptions: everything the attnserve server is configured with (flags map onto these; see
// server_flags.h). A plain struct; defaults are the documented production defaults.
#ifndef ATTNSERVE_SERVER_APP_SERVER_OPTIONS_H_
#define ATTNSERVE_SERVER_APP_SERVER_OPTIONS_H_

#include <cstdint>
#include <string>

#include "server/app/tls_credentials.h"
#include "server/decoding/decode_types.h"
#include "server/http/http_server.h"
#include "server/repository/model_repository.h"
#include "server/runtime/batch_runner.h"
#include "server/runtime/model_limits.h"

namespace attnserve::server {

struct ServerOptions {
  // host:port to listen on; port 0 picks a free port (Server::port() tells which).
  std::string grpc_address = "0.0.0.0:50051";
  // Transport security of grpc_address (plaintext by default; TLS or mutual TLS, for every
  // service on the port).
  TlsOptions tls = {};
  // The Open Inference Protocol's HTTP/REST binding (http_server.h); http.address "" = off.
  // HTTPS with `tls`'s files when TLS is on (mutual TLS too). http.max_body_bytes is set from
  // max_message_bytes.
  http::HttpServerOptions http;
  // host:port of the Prometheus endpoint (HTTP, path /metrics); port 0 picks a free port
  // (Server::metrics_port() tells which); "" = no metrics at all.
  std::string metrics_address = "0.0.0.0:8002";
  // The git revision the binary was built from, for attnserve_build_info{revision} and the
  // startup summary; main() sets it from the build. "unknown" when not known.
  std::string git_revision = "unknown";
  repository::ModelRepositoryOptions repository;
  // Milliseconds between repository scans for added, changed or removed model folders; 0 = never
  // (models load once at start).
  int64_t model_poll_interval_ms = 5000;
  // Limits of models whose config.json sets none. request.max_response_bytes is set from
  // max_message_bytes.
  ModelLimits model_limits;
  // The model that answers requests naming none (""). Empty: the only serving model, or "demo"
  // when several serve and one is named so.
  std::string default_model;
  // Batch threads shared by every model (the shared batch scheduler); 0 = one per compute thread,
  // so that under load every compute thread has a batch.
  int num_batch_threads = 0;
  // The most bytes of request inputs (query, memory, masks) queued in all models' queues
  // together; a request that would pass it gets RESOURCE_EXHAUSTED at once. 0 = no limit.
  int64_t max_queued_bytes = int64_t{512} << 20;
  BatchRunnerOptions runner;
  // Largest request or response message, in bytes (gRPC's default of 4 MiB is one [2048, 512]
  // float32 tensor).
  int64_t max_message_bytes = int64_t{64} << 20;
  // A connection older than this gets a GOAWAY and the client reconnects; 0 = connections live
  // forever. Clients re-resolve DNS only when a connection closes, so behind a headless service
  // this is what lets new replicas receive traffic from existing clients.
  int64_t max_connection_age_ms = 0;
  // After that GOAWAY, how long calls already open on the connection may still run before it is
  // closed. Used only when max_connection_age_ms > 0.
  int64_t max_connection_age_grace_ms = 30000;
  // A connection with no call open for this long is closed (GOAWAY), so clients that connect and
  // go quiet (or never start HTTP/2) do not hold file descriptors forever; 0 = never. Clients
  // reconnect by themselves on their next call.
  int64_t max_connection_idle_ms = 300000;
  // The server pings a connection silent for keepalive_time_ms and closes it when no answer comes
  // within keepalive_timeout_ms, so vanished clients (a cut network) free their connections.
  int64_t keepalive_time_ms = 60000;
  int64_t keepalive_timeout_ms = 20000;
  // The most calls open at once on one connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS); a
  // client queues the ones past it. >= 1.
  int max_concurrent_streams = 128;
  // The most bytes of answers one AttendStream holds for a client that does not read them
  // (answers being computed count their payload size); at the limit the server stops reading
  // that stream until the client catches up. >= 1. A stream holds at most this plus one answer.
  int64_t max_stream_unsent_bytes = int64_t{64} << 20;
  // The same for all streams together: past it, a stream with a message in flight stops reading
  // until its own answers are written (one with none may still read one). >= 1. All streams hold
  // at most this plus one answer each.
  int64_t max_streams_unsent_bytes = int64_t{256} << 20;
  // Memory gRPC itself may use for connections (read and write buffers, messages being received),
  // in bytes: its resource quota. Under pressure gRPC shrinks buffers and refuses new streams
  // rather than grow. 0 = gRPC's default (no quota).
  int64_t grpc_memory_bytes = int64_t{512} << 20;
  // The HTTP/2 flow-control window of each stream, in bytes: how much of a client's uploads gRPC
  // buffers for a stream that is not reading (a stream paused for a slow reader, above). Fixed:
  // gRPC's bandwidth-delay probing, which grows windows to what the link carries, is off, since
  // with it 100 paused streams filled grpc_memory_bytes and gRPC reset streams. A stream then
  // moves at most this much per round trip (1 MiB: 2 GB/s at 0.5 ms). 64 KiB .. 1 GiB.
  int64_t grpc_stream_window_bytes = int64_t{1} << 20;
  // How often the allocator's free memory is handed back to the system (memory_trimmer.h), in
  // milliseconds; 0 = never.
  int64_t malloc_trim_interval_ms = 10000;
  // A connection that has not finished its HTTP/2 (and TLS) handshake in this long is closed.
  int64_t handshake_timeout_ms = 10000;
  // Decoding sessions (attnserve.v1 Decode): the KV cache budget, iteration sizes and the idle
  // timeout (decode_types.h). kv.budget_bytes 0 (the default) is derived from the memory limit
  // (kv_cache_budget.h: an eighth of the container's limit or of RAM; 256 MiB = 32,768 cached
  // tokens of d_model 512 under the deployment's 2 GiB). compute_threads 0 is resolved to
  // runner.compute_threads.
  decoding::DecodeRuntimeOptions decoding = {.kv = {.budget_bytes = 0}};
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_APP_SERVER_OPTIONS_H_
