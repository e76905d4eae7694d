#include "server/repository/model_repository.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/forward/onednn_support.h"

namespace attnserve::repository {

using model::DemoModel;
using model::IsValidModelName;
using model::kConfigFileName;
using model::kDemoModelName;
using model::kWeightsFileName;
using model::LoadModelFolder;
using model::Model;
std::string_view EventKindName(ModelEvent::Kind kind) {
  switch (kind) {
    case ModelEvent::Kind::kLoaded:
      return "loaded";
    case ModelEvent::Kind::kReloaded:
      return "reloaded";
    case ModelEvent::Kind::kUnloaded:
      return "unloaded";
    case ModelEvent::Kind::kFailed:
      return "failed";
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<ModelRepository>> ModelRepository::Open(
    const ModelRepositoryOptions& options) {
  std::error_code ec;
  const std::filesystem::file_status root = std::filesystem::status(options.root, ec);
  const bool root_missing = root.type() == std::filesystem::file_type::not_found;
  if (!root_missing && root.type() != std::filesystem::file_type::directory) {
    return absl::InvalidArgumentError(
        absl::StrCat("model repository ", options.root.string(), ": ",
                     ec ? ec.message() : std::string("not a folder")));
  }
  const bool demo = options.demo_model == DemoModelPolicy::kAlways ||
                    (options.demo_model == DemoModelPolicy::kWhenNoRepository && root_missing);
  std::unique_ptr<ModelRepository> repo(new ModelRepository(options, demo));
  absl::StatusOr<std::vector<std::string>> names = repo->ScanNames();
  if (!names.ok()) return names.status();
  std::lock_guard<std::mutex> load_lock(repo->load_mu_);
  for (const std::string& name : *names) repo->LoadAndSwap(name, repo->FingerprintOf(name));
  if (demo) {
    // After the folders: a "demo" folder that loaded takes the name (as version 1), and the
    // embedded model only fills in when none did (no folder, or one that failed to load).
    std::lock_guard<std::mutex> lock(repo->mu_);
    Entry& entry = repo->entries_[kDemoModelName];
    if (entry.serving == nullptr) repo->ServeEmbeddedDemo(kDemoModelName, entry);
  }
  return repo;
}

absl::StatusOr<std::shared_ptr<const model::Model>> ModelRepository::Get(
    std::string_view name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(name);
  if (it == entries_.end()) {
    std::vector<std::string> serving;
    for (const auto& [n, entry] : entries_) {
      if (entry.serving) serving.push_back(n);
    }
    return absl::NotFoundError(absl::StrCat(
        "model \"", std::string(name),
        "\" not found; serving: ", serving.empty() ? "none" : absl::StrJoin(serving, ", ")));
  }
  if (!it->second.serving) {
    return absl::UnavailableError(absl::StrCat(
        "model \"", std::string(name), "\" failed to load: ", it->second.last_error.message()));
  }
  return it->second.serving;
}

std::vector<std::shared_ptr<const model::Model>> ModelRepository::ServingModels() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<const model::Model>> models;
  for (const auto& [name, entry] : entries_) {
    if (entry.serving) models.push_back(entry.serving);
  }
  return models;
}

std::vector<ModelState> ModelRepository::States() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<ModelState> states;
  for (const auto& [name, entry] : entries_) {
    states.push_back({name, entry.serving, entry.last_error});
  }
  return states;
}

absl::Status ModelRepository::Reload(std::string_view name) {
  if (!IsValidModelName(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model name \"", std::string(name),
                     "\": expected a folder name (non-empty, no '/', not starting with '.')"));
  }
  std::lock_guard<std::mutex> load_lock(load_mu_);
  std::error_code ec;
  const std::filesystem::path folder = options_.root / std::string(name);
  // Only what Poll() would list (a folder, or a symlink that loading follows): a plain file is
  // no model folder, and must not become a failed model until the next Poll() unloads it.
  const std::filesystem::file_status st = std::filesystem::symlink_status(folder, ec);
  if (!std::filesystem::is_directory(st) && !std::filesystem::is_symlink(st)) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(name);
    if (it != entries_.end() && it->second.embedded) {
      return absl::FailedPreconditionError(absl::StrCat(
          "model \"", std::string(name), "\" is embedded; there is no folder to reload"));
    }
    return absl::NotFoundError(absl::StrCat(folder.string(), ": no such model folder"));
  }
  const std::string key(name);
  return LoadAndSwap(key, FingerprintOf(key)).status;
}

absl::Status ModelRepository::scan_status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return scan_status_;
}

std::vector<ModelEvent> ModelRepository::Poll() {
  std::lock_guard<std::mutex> load_lock(load_mu_);
  absl::StatusOr<std::vector<std::string>> names = ScanNames();
  {
    std::lock_guard<std::mutex> lock(mu_);
    scan_status_ = names.status();
  }
  // An unreadable root says nothing about the models: unloading them all would turn a transient
  // permission or mount problem into an outage.
  if (!names.ok()) return {};

  std::map<std::string, Entry, std::less<>> known;
  {
    std::lock_guard<std::mutex> lock(mu_);
    known = entries_;
  }
  std::vector<ModelEvent> events;
  for (const std::string& name : *names) {
    auto it = known.find(name);
    Fingerprint fingerprint = FingerprintOf(name);
    if (it == known.end() || it->second.fingerprint != fingerprint) {
      events.push_back(LoadAndSwap(name, std::move(fingerprint)));
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [name, entry] : known) {
    if (std::binary_search(names->begin(), names->end(), name)) continue;
    if (name == kDemoModelName && serves_embedded_demo_) {
      // The folder that replaced the embedded demo (or failed to) is gone: back to the embedded
      // one, without the folder's error.
      if (entry.embedded && entry.fingerprint == Fingerprint{}) continue;  // Never replaced.
      Entry& live = entries_[name];
      live.fingerprint = Fingerprint{};
      live.last_error = absl::OkStatus();
      if (entry.embedded) continue;  // It served all along: nothing a reader sees changed.
      ServeEmbeddedDemo(name, live);
      if (live.serving != nullptr) {
        events.push_back({ModelEvent::Kind::kReloaded, name, live.serving->version, {}});
      } else {
        events.push_back({ModelEvent::Kind::kFailed, name, 0, live.last_error});
      }
      continue;
    }
    entries_.erase(name);
    events.push_back({ModelEvent::Kind::kUnloaded, name, 0, absl::OkStatus()});
  }
  std::sort(events.begin(), events.end(),
            [](const ModelEvent& a, const ModelEvent& b) { return a.name < b.name; });
  return events;
}

int64_t ModelRepository::NextVersion(const std::string& name) { return ++last_versions_[name]; }

void ModelRepository::ServeEmbeddedDemo(const std::string& name, Entry& entry) {
  entry.embedded = true;
  // --compute-dtype applies to the demo model too; on a CPU without native bf16 it is refused
  // like any bf16 model (unless emulation is allowed).
  const core::ComputeType type = options_.load.compute_type.value_or(core::ComputeType::kFloat32);
  absl::Status supported =
      core::CheckComputeTypeSupported(type, options_.load.allow_bf16_emulation, "demo");
  absl::StatusOr<std::shared_ptr<const model::Model>> demo =
      supported.ok() ? DemoModel(type) : supported;
  if (!demo.ok()) {
    entry.serving = nullptr;
    if (entry.last_error.ok()) entry.last_error = demo.status();
    return;
  }
  // A copy sharing the packed layer: the copy carries this name's next version, so the embedded
  // model coming back after a "demo" folder is told apart from every version served before.
  auto model = std::make_shared<Model>(**demo);
  model->version = NextVersion(name);
  model->config.kv_cache_dtype = options_.load.default_kv_cache_dtype;
  entry.serving = std::move(model);
}

absl::StatusOr<std::vector<std::string>> ModelRepository::ScanNames() const {
  std::error_code ec;
  const bool root_exists = std::filesystem::exists(options_.root, ec);
  // Only a root that is truly gone is empty: one that cannot be examined (a symlink loop, no
  // permission, an I/O error) must not unload every model.
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("model repository ", options_.root.string(), ": ", ec.message()));
  }
  if (!root_exists) return std::vector<std::string>();
  std::vector<std::string> names;
  std::filesystem::directory_iterator it(options_.root, ec);
  for (; !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!IsValidModelName(name)) continue;
    std::error_code entry_ec;
    // Symlinks are followed; a broken or looping one is listed so that loading reports why.
    if (it->is_directory(entry_ec) || it->is_symlink(entry_ec)) names.push_back(name);
  }
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("model repository ", options_.root.string(), ": ", ec.message()));
  }
  std::sort(names.begin(), names.end());
  return names;
}

ModelRepository::Fingerprint ModelRepository::FingerprintOf(const std::string& name) const {
  Fingerprint fp;
  for (const char* file : {kConfigFileName, kWeightsFileName}) {
    const std::string path = (options_.root / name / file).string();
    struct stat st {};
    if (stat(path.c_str(), &st) != 0) {
      fp.stats.insert(fp.stats.end(), {0, errno, 0, 0, 0, 0});
      continue;
    }
    auto ns = [](const timespec& t) {
      return static_cast<int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
    };
    // ctime too: a chmod that makes an unreadable file readable changes nothing else.
    fp.stats.insert(fp.stats.end(),
                    {1, static_cast<int64_t>(st.st_size), ns(st.st_mtim), ns(st.st_ctim),
                     static_cast<int64_t>(st.st_ino), static_cast<int64_t>(st.st_dev)});
  }
  return fp;
}

ModelEvent ModelRepository::LoadAndSwap(const std::string& name, Fingerprint fingerprint) {
  absl::StatusOr<std::shared_ptr<const model::Model>> loaded =
      LoadModelFolder(options_.root / name, options_.load);

  std::lock_guard<std::mutex> lock(mu_);
  Entry& entry = entries_[name];
  entry.fingerprint = std::move(fingerprint);
  if (!loaded.ok()) {
    entry.last_error = loaded.status();
    return {ModelEvent::Kind::kFailed, name, entry.serving ? entry.serving->version : 0,
            loaded.status()};
  }
  auto model = std::make_shared<Model>(**loaded);
  const bool replaces = entry.serving != nullptr;
  model->version = NextVersion(name);
  entry.serving = std::move(model);
  entry.last_error = absl::OkStatus();
  entry.embedded = false;
  return {replaces ? ModelEvent::Kind::kReloaded : ModelEvent::Kind::kLoaded, name,
          entry.serving->version, absl::OkStatus()};
}

}  // namespace attnserve::repository
