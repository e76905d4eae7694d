// LruCache: a bounded map that evicts the least recently used entry when full.
//
// Used to keep oneDNN primitives per shape: a hit costs one hash lookup and a list splice and
// never allocates. Not thread-safe. Pointers returned stay valid until that entry is evicted.
#ifndef ATTNSERVE_CORE_UTIL_LRU_CACHE_H_
#define ATTNSERVE_CORE_UTIL_LRU_CACHE_H_

#include <algorithm>
#include <cstddef>
#include <list>
#include <utility>

#include "absl/container/flat_hash_map.h"

namespace attnserve::core {

template <typename Key, typename Value>
class LruCache {
 public:
  // capacity: the most entries kept (at least 1).
  explicit LruCache(size_t capacity) : capacity_(std::max<size_t>(1, capacity)) {}

  LruCache(const LruCache&) = delete;
  LruCache& operator=(const LruCache&) = delete;

  // The entry for `key`, now the most recently used; nullptr if absent.
  Value* Find(const Key& key) {
    auto it = index_.find(key);
    if (it == index_.end()) return nullptr;
    entries_.splice(entries_.begin(), entries_, it->second);
    return &it->second->second;
  }

  // Adds `value` under `key` (which must be absent), evicting the least recently used entry if
  // the cache is full. Returns the stored value.
  Value* Insert(const Key& key, Value value) {
    if (entries_.size() >= capacity_) {
      index_.erase(entries_.back().first);
      entries_.pop_back();
    }
    entries_.emplace_front(key, std::move(value));
    try {
      index_.emplace(key, entries_.begin());
    } catch (...) {
      entries_.pop_front();  // Keep list and index in step if the index cannot grow.
      throw;
    }
    return &entries_.front().second;
  }

  size_t size() const { return entries_.size(); }

 private:
  using Entries = std::list<std::pair<Key, Value>>;
  size_t capacity_;
  Entries entries_;  // Most recently used first.
  absl::flat_hash_map<Key, typename Entries::iterator> index_;
};

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_UTIL_LRU_CACHE_H_
