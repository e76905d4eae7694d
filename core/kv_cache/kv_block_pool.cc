#include "core/kv_cache/kv_block_pool.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <new>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "core/forward/bf16_conversion.h"
#include "core/kv_cache/int8_rows.h"

namespace attnserve::core {
namespace {

absl::Status Mismatch(const char* field, int64_t expected, int64_t received) {
  return absl::FailedPreconditionError(
      absl::StrCat("KV cache belongs to another model version: ", field, " is ", expected,
                   " in the cache, ", received, " in the layer"));
}

constexpr size_t kHugePageBytes = size_t{2} << 20;  // x86-64's transparent huge page.

int64_t PageBytes() {
  static const int64_t page_bytes = sysconf(_SC_PAGESIZE);
  return page_bytes;
}

}  // namespace

std::unique_ptr<std::byte, KvBlockPool::Unmap> KvBlockPool::MapArena(size_t bytes,
                                                                     bool huge_pages) {
  const auto page = static_cast<size_t>(PageBytes());
  bytes = (bytes + page - 1) / page * page;
  huge_pages = huge_pages && bytes >= kHugePageBytes;
  // A huge page needs a 2 MiB-aligned 2 MiB of the mapping: map one huge page more than needed
  // and give back the unaligned head and the rest of the tail.
  const size_t reserve = huge_pages ? bytes + kHugePageBytes : bytes;
  void* mapped = mmap(nullptr, reserve, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapped == MAP_FAILED) throw std::bad_alloc();
  auto* arena = static_cast<std::byte*>(mapped);
  if (huge_pages) {
    const size_t head =
        (kHugePageBytes - reinterpret_cast<uintptr_t>(arena) % kHugePageBytes) % kHugePageBytes;
    if (head > 0) munmap(arena, head);
    munmap(arena + head + bytes, reserve - head - bytes);  // Non-empty: head < kHugePageBytes.
    arena += head;
    // Advice only: where THP is off (or not built in) the arena keeps 4 KiB pages.
    madvise(arena, bytes, MADV_HUGEPAGE);
  }
  return std::unique_ptr<std::byte, Unmap>(arena, Unmap{bytes});
}

void KvBlockPool::Unmap::operator()(std::byte* arena) const { munmap(arena, bytes); }

absl::StatusOr<std::unique_ptr<KvBlockPool>> KvBlockPool::Create(const AttentionConfig& identity,
                                                                 const KvCacheOptions& options) {
  if (auto s = identity.Validate(); !s.ok()) return s;
  if (options.block_tokens <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("block_tokens must be > 0, got ", options.block_tokens));
  }
  if (options.max_sequence_tokens <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_sequence_tokens must be > 0, got ", options.max_sequence_tokens));
  }
  const Layout layout = LayoutFor(identity, options);
  const int64_t block_bytes = layout.data_bytes + layout.scale_bytes;
  const int64_t blocks = options.budget_bytes / block_bytes;
  if (blocks < 1 || blocks > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("budget_bytes must hold between 1 and 2^31-1 blocks of ", block_bytes,
                     " bytes, got ", options.budget_bytes));
  }
  try {
    return std::unique_ptr<KvBlockPool>(new KvBlockPool(KvCacheIdentity::Of(identity), options,
                                                        layout, static_cast<size_t>(blocks)));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV cache: cannot allocate ", blocks * block_bytes, " bytes"));
  }
}

KvBlockPool::Layout KvBlockPool::LayoutFor(const AttentionConfig& identity,
                                           const KvCacheOptions& options) {
  const KvElementType type =
      options.int8 ? KvElementType::kInt8 : KvElementTypeFor(identity.compute_type);
  const int64_t rows = 2 * options.block_tokens * identity.d_model;  // K and V.
  const int64_t scales =
      type == KvElementType::kInt8 ? 2 * options.block_tokens * identity.num_heads : 0;
  return {.element_type = type,
          .data_bytes = rows * ElementBytes(type),
          .scale_bytes = scales * int64_t{sizeof(uint16_t)}};
}

KvBlockPool::KvBlockPool(const KvCacheIdentity& identity, const KvCacheOptions& options,
                         const Layout& layout, size_t capacity)
    : identity_(identity),
      options_(options),
      capacity_(capacity),
      layout_(layout),
      block_elements_(2 * options.block_tokens * identity.d_model),
      // block_elements_ is even, so a bf16 arena is a whole number of floats.
      arena_(MapArena(capacity * static_cast<size_t>(layout.data_bytes), options.huge_pages)),
      scale_arena_(
          layout.scale_bytes > 0
              ? MapArena(capacity * static_cast<size_t>(layout.scale_bytes), options.huge_pages)
              : std::unique_ptr<std::byte, Unmap>(nullptr, Unmap{})),
      discarded_flags_(capacity, false) {
  free_.reserve(capacity);
  // Highest id at the bottom so block 0 is handed out first.
  for (size_t b = capacity; b-- > 0;) free_.push_back(static_cast<int32_t>(b));
}

absl::Status KvBlockPool::CheckIdentity(const AttentionConfig& config) const {
  const KvCacheIdentity other = KvCacheIdentity::Of(config);
  if (other.d_model != identity_.d_model) {
    return Mismatch("d_model", identity_.d_model, other.d_model);
  }
  if (other.num_heads != identity_.num_heads) {
    return Mismatch("num_heads", identity_.num_heads, other.num_heads);
  }
  if (other.variant != identity_.variant) {
    return absl::FailedPreconditionError(
        absl::StrCat("KV cache belongs to another model version: variant is ",
                     std::string(VariantName(identity_.variant)), " in the cache, ",
                     std::string(VariantName(other.variant)), " in the layer"));
  }
  if (other.compute_type != identity_.compute_type) {
    return absl::FailedPreconditionError(
        absl::StrCat("KV cache belongs to another model version: compute type is ",
                     std::string(ComputeTypeName(identity_.compute_type)), " in the cache, ",
                     std::string(ComputeTypeName(other.compute_type)), " in the layer"));
  }
  return absl::OkStatus();
}

absl::Status KvBlockPool::Reserve(KvSequence& seq, int64_t new_tokens) {
  if (new_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("new_tokens must be >= 0, got ", new_tokens));
  }
  const int64_t length = seq.length + new_tokens;
  if (length > options_.max_sequence_tokens) {
    return absl::OutOfRangeError(absl::StrCat("sequence would reach ", length,
                                              " cached tokens; max_sequence_tokens is ",
                                              options_.max_sequence_tokens));
  }
  const int64_t have = static_cast<int64_t>(seq.blocks.size());
  const int64_t need = BlocksFor(length) - have;
  if (need <= 0) return absl::OkStatus();
  if (need > free_blocks()) {
    return absl::ResourceExhaustedError(absl::StrCat("KV cache full: ", need,
                                                     " more blocks needed, ", free_blocks(), " of ",
                                                     total_blocks(), " free"));
  }
  seq.blocks.reserve(have + need);  // May throw before anything changed.
  for (int64_t i = 0; i < need; ++i) {
    const int32_t block = free_.back();
    free_.pop_back();
    seq.blocks.push_back(block);
    high_water_ = std::max<int64_t>(high_water_, int64_t{block} + 1);
    if (discarded_flags_[block]) {  // Its pages come back as the forward pass writes them.
      discarded_flags_[block] = false;
      --discarded_;
    }
  }
  touched_ = std::max(touched_, high_water_);
  return absl::OkStatus();
}

int64_t KvBlockPool::Prefault(int64_t until_block, int64_t max_blocks,
                              const std::atomic<bool>* stop) {
  const int64_t end =
      std::min({until_block, total_blocks(), touched_ + std::max<int64_t>(0, max_blocks)});
  const int64_t first = touched_;
  // One byte per page is enough: the kernel maps and zero-fills the whole page on its first write.
  const int64_t page_bytes = PageBytes();
  const auto touch = [page_bytes, stop](std::byte* start, int64_t bytes) {
    volatile std::byte* const begin = start;
    for (int64_t offset = 0; offset < bytes; offset += page_bytes) {
      if (stop != nullptr && stop->load(std::memory_order_relaxed)) return false;
      begin[offset] = std::byte{0};
    }
    begin[bytes - 1] = std::byte{0};  // The last page, when the stride stepped over its start.
    return true;
  };
  for (int64_t block = touched_; block < end; ++block) {
    const auto id = static_cast<int32_t>(block);
    if (!touch(Element(id, 0), layout_.data_bytes)) break;
    if (scale_arena_ && !touch(reinterpret_cast<std::byte*>(Scales(id, 0)), layout_.scale_bytes)) {
      break;
    }
    touched_ = block + 1;
  }
  return touched_ - first;
}

int64_t KvBlockPool::DiscardFreeBlocks(int64_t max_blocks) {
  // The scale arena of an int8 pool (3 % of it for 64-wide heads) is left resident.
  if (layout_.data_bytes % PageBytes() != 0) return 0;
  int64_t discarded = 0;
  // From the bottom of the LIFO: the blocks released longest ago.
  for (size_t i = 0; i < free_.size() && discarded < max_blocks; ++i) {
    const int32_t block = free_[i];
    if (block >= touched_ || discarded_flags_[block]) continue;
    if (madvise(Element(block, 0), static_cast<size_t>(layout_.data_bytes), MADV_DONTNEED) != 0) {
      break;
    }
    if (options_.huge_pages) {
      // Advice only (it can fail where THP is not built in): a collapse would fill the block's
      // pages again.
      madvise(Element(block, 0), static_cast<size_t>(layout_.data_bytes), MADV_NOHUGEPAGE);
    }
    discarded_flags_[block] = true;
    ++discarded_;
    ++discarded;
  }
  return discarded;
}

void KvBlockPool::Trim(KvSequence& seq) {
  const size_t keep = static_cast<size_t>(BlocksFor(seq.length));
  while (seq.blocks.size() > keep) {
    free_.push_back(seq.blocks.back());
    seq.blocks.pop_back();
  }
}

void KvBlockPool::Release(KvSequence& seq) {
  // In reverse so the sequence's first block is the next handed out (keeps LIFO order tidy).
  for (auto it = seq.blocks.rbegin(); it != seq.blocks.rend(); ++it) free_.push_back(*it);
  seq.blocks.clear();
  seq.length = 0;
}

void KvBlockPool::Write(const KvSequence& seq, int64_t rows, const float* k, int64_t k_ld,
                        const float* v, int64_t v_ld) {
  const int64_t bt = options_.block_tokens, dk = head_dim(), h = identity_.num_heads;
  absl::InlinedVector<int8_t, 256> row;  // An int8 row before it is laid out in its block.
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t token = seq.length + r;
    const int32_t block = seq.blocks[token / bt];
    const int64_t slot = (token % bt) * dk;
    for (int64_t part = 0; part < 2 * h; ++part) {  // K heads, then V heads.
      const float* src = part < h ? k + r * k_ld + part * dk : v + r * v_ld + (part - h) * dk;
      std::byte* dst = Element(block, part);
      switch (layout_.element_type) {
        case KvElementType::kBFloat16:
          RoundToBf16(src, dk, reinterpret_cast<uint16_t*>(dst) + slot);
          break;
        case KvElementType::kInt8: {
          row.resize(dk);
          Scales(block, part)[token % bt] = QuantizeInt8Row(src, dk, row.data());
          auto* block_rows = reinterpret_cast<int8_t*>(dst);
          if (part < h) {
            StoreInt8KeyRow(row.data(), bt, dk, token % bt, block_rows);
          } else {
            StoreInt8ValueRow(row.data(), bt, dk, token % bt, block_rows);
          }
          break;
        }
        case KvElementType::kFloat32:
          std::copy_n(src, dk, reinterpret_cast<float*>(dst) + slot);
          break;
      }
    }
  }
}

}  // namespace attnserve::core
