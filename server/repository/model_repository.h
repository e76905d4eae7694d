// ModelRepository: every model of a repository folder, loaded and ready to serve, with atomic
// reloads.
//
// The repository folder holds one sub-folder per model (model.h); the folder name is the model
// name. Folders whose name starts with "." are ignored (editors' and Kubernetes' ConfigMap
// bookkeeping, temporary folders), as are plain files. Every model is loaded when the repository
// opens; a folder that fails to load is recorded with its error and the others serve.
//
// Every model that starts serving under a name gets the name's next version number: 1, 2, ...
// counted for the life of the repository, across removal and restoration of the folder, so a
// number a client has seen never names other weights. Failed loads use no number.
//
// Thread-safe: Get/ServingModels/States may run concurrently with Reload/Poll (which serialize
// among themselves). Readers get shared_ptr<const Model>, so a reload never disturbs work in
// flight: it keeps the model version it started with.
#ifndef ATTNSERVE_SERVER_REPOSITORY_MODEL_REPOSITORY_H_
#define ATTNSERVE_SERVER_REPOSITORY_MODEL_REPOSITORY_H_

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/model/model.h"

namespace attnserve::repository {

// When the embedded `demo` model (model.h) is served. A folder named "demo" in the repository
// takes its place while the folder exists; when Poll() finds it gone, the embedded one serves
// again.
enum class DemoModelPolicy {
  kWhenNoRepository,  // Only when the repository folder does not exist (the default).
  kAlways,
  kNever,
};

struct ModelRepositoryOptions {
  // The repository folder. Default: "models" (relative to the working directory).
  std::filesystem::path root = "models";
  DemoModelPolicy demo_model = DemoModelPolicy::kWhenNoRepository;
  // Compute type override and bf16 emulation policy for every model (model.h), the embedded
  // demo model included.
  model::LoadOptions load = {};
};

// What one Poll() or Reload() did to one model.
struct ModelEvent {
  enum class Kind {
    kLoaded,    // A new model now serves.
    kReloaded,  // A new version replaced the serving one.
    kUnloaded,  // Its folder disappeared; the model no longer serves.
    kFailed,    // Loading failed (status says why); the previous version, if any, still serves.
  };
  Kind kind = Kind::kLoaded;
  std::string name;
  int64_t version = 0;  // Serving version after the event; 0 when none serves.
  absl::Status status;  // Why, for kFailed; OK otherwise.
};
std::string_view EventKindName(ModelEvent::Kind kind);  // "loaded", "reloaded", ...

// One model name the repository knows: what serves under it and how its last load went.
struct ModelState {
  std::string name;
  std::shared_ptr<const model::Model> serving;  // Null when no version has loaded.
  absl::Status last_error;                      // OK, or why the most recent load failed.
};

class ModelRepository {
 public:
  // Scans options.root and loads every model folder. Fails only when the repository itself is
  // unusable: InvalidArgument when root exists but is not a folder or cannot be listed (with the
  // system's reason). A missing root is an empty repository (plus `demo`, by default).
  static absl::StatusOr<std::unique_ptr<ModelRepository>> Open(
      const ModelRepositoryOptions& options);

  ModelRepository(const ModelRepository&) = delete;
  ModelRepository& operator=(const ModelRepository&) = delete;

  // The serving version of `name`. NotFound listing the serving models when the name is
  // unknown; Unavailable with the load error when the name is known but no version has loaded.
  absl::StatusOr<std::shared_ptr<const model::Model>> Get(std::string_view name) const;
  // Every serving model, sorted by name.
  std::vector<std::shared_ptr<const model::Model>> ServingModels() const;
  // Every known name (serving or failed), sorted.
  std::vector<ModelState> States() const;

  // Loads <root>/<name> again (or for the first time) and swaps it in atomically as the name's
  // next version. On failure the previous version keeps serving and the error (naming file,
  // tensor, expected and actual value; or the weights' expected and actual SHA-256) is returned
  // and recorded. NotFound when the folder does not exist; FailedPrecondition for the
  // embedded demo model.
  absl::Status Reload(std::string_view name);

  // Rescans root: loads new folders, reloads folders whose config.json or weights.safetensors
  // changed (size, modification or status-change time, or inode; symlinks followed), and unloads
  // models whose folder is gone. A failed load is retried only after its files change again.
  // Returns what happened, in name order. When root cannot be listed (replaced by a file, a
  // symlink loop, no permission), nothing is loaded or unloaded: every model keeps serving, Poll
  // returns no event, and scan_status() says why until a later scan succeeds.
  std::vector<ModelEvent> Poll();

  // OK, or why the most recent Poll() could not list root (naming it and the system's reason).
  absl::Status scan_status() const;

  const ModelRepositoryOptions& options() const { return options_; }

 private:
  // Identifies the files one load read, to notice changes cheaply.
  struct Fingerprint {
    std::vector<int64_t> stats;  // Per file: present, size, mtime, ctime (ns), inode, device.
    bool operator==(const Fingerprint&) const = default;
  };
  struct Entry {
    std::shared_ptr<const model::Model> serving;
    absl::Status last_error;
    Fingerprint fingerprint;  // Of the files at the most recent load attempt.
    bool embedded = false;
  };

  ModelRepository(ModelRepositoryOptions options, bool serves_embedded_demo)
      : options_(std::move(options)), serves_embedded_demo_(serves_embedded_demo) {}

  // The version number for the next model to serve under `name`: one more than the last one
  // given to that name since the repository opened (1 for the first), whatever happened in
  // between (failed loads, removal, replacement).
  int64_t NextVersion(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes `entry` (of `name`) serve the embedded demo model as the name's next version, keeping
  // its error and fingerprint; if DemoModel() cannot be built, nothing serves and its error is
  // recorded unless the entry already has one.
  void ServeEmbeddedDemo(const std::string& name, Entry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Model folder names under root, sorted; an error when root cannot be listed.
  absl::StatusOr<std::vector<std::string>> ScanNames() const;
  Fingerprint FingerprintOf(const std::string& name) const;
  // Loads <root>/<name> (slow, outside mu_) and records the outcome with `fingerprint`, which
  // the caller takes before the load so that a change made during it is seen by the next Poll().
  // Returns the event.
  ModelEvent LoadAndSwap(const std::string& name, Fingerprint fingerprint)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(load_mu_);

  const ModelRepositoryOptions options_;
  // Whether the policy serves the embedded demo; a "demo" folder replaces it while it exists.
  const bool serves_embedded_demo_;
  std::mutex load_mu_;  // Serializes loading (Reload, Poll): one load at a time.
  absl::Status scan_status_ ABSL_GUARDED_BY(mu_);
  mutable std::mutex mu_;
  std::map<std::string, Entry, std::less<>> entries_ ABSL_GUARDED_BY(mu_);
  // The last version given to each name that ever served, kept when the name's entry goes (its
  // folder removed) so that a restored model continues the count instead of reusing a number a
  // client may have seen with other weights. One integer per name, for the life of the process.
  std::map<std::string, int64_t, std::less<>> last_versions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace attnserve::repository

#endif  // ATTNSERVE_SERVER_REPOSITORY_MODEL_REPOSITORY_H_
