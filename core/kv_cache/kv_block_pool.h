// KvBlockPool: a paged key/value cache for incremental decoding (after vLLM's block manager).
//
// The pool is one arena cut into fixed-size blocks of `block_tokens` tokens. A block holds the K
// and V rows of every head for its tokens, head-major, so that the attention kernels read one
// head's keys of a block as one contiguous [block_tokens, head_dim] array:
//   block = K[head 0][block_tokens][head_dim] … K[head h-1][…] | V[head 0][…] … V[head h-1][…]
// A sequence owns a KvSequence: its block table (block ids in token order) and its length.
// Allocation and release are O(1) per block (a LIFO free list); since every block has the same
// size the arena never fragments — any free block serves any sequence.
//
// A pool belongs to one model version: its KvCacheIdentity (d_model, heads, variant, compute
// type). The forward passes refuse a layer whose config does not match (cached_attention.h).
// The element type follows the compute type: an fp32 model's pool stores fp32 (its cached steps
// equal a full forward to 1e-5), a bf16 model's pool stores bf16 (half the bytes per token; its
// full forward rounds K and V to bf16 too, so nothing is lost that the full forward keeps).
// There is deliberately no option to store bf16 for an fp32 model: its cached steps would no
// longer equal its own full forward; such a model can be configured as bf16 compute instead.
// KvCacheOptions::int8 stores either model's K and V as int8 rows with a bf16 scale per token and
// head (int8_rows.h): a quarter (fp32) or half (bf16) of the bytes per token, where a step reads
// every cached byte; its outputs differ from a full forward's by the rounding to 1/254 of each
// row's largest value. Within a head's [block_tokens, head_dim] bytes the int8 rows are tiled
// for the integer kernel (int8_rows.h: keys sixteen rows to a tile, values four). The scales sit in
// a second arena indexed like the blocks, so that a block's K and V stay a whole number of pages
// (DiscardFreeBlocks gives back whole pages only):
//   scales of a block = K scales[head 0][block_tokens] … [head h-1] | V scales[head 0] … [head h-1]
//
// Thread-safety: NOT thread-safe. One pool and its KvSequences are used by one thread at a time
// (e.g. the thread that owns the CachedAttentionExecutor); callers serialise access themselves.
// Ownership: the pool owns the arena; a KvSequence only names blocks of the pool it was grown
// from and must be released to that same pool (Release) before the pool is destroyed or the
// sequence is dropped, or its blocks stay allocated.
#ifndef ATTNSERVE_CORE_KV_CACHE_KV_BLOCK_POOL_H_
#define ATTNSERVE_CORE_KV_CACHE_KV_BLOCK_POOL_H_

#include <atomic>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/forward/attention_config.h"
#include "core/kv_cache/kv_element_type.h"

namespace attnserve::core {

// The model version a pool's contents belong to.
struct KvCacheIdentity {
  int64_t d_model = 512;
  int64_t num_heads = 8;
  AttentionVariant variant = AttentionVariant::kMultiHead;
  ComputeType compute_type = ComputeType::kFloat32;

  static KvCacheIdentity Of(const AttentionConfig& config) {
    return {config.d_model, config.num_heads, config.variant, config.compute_type};
  }
  bool operator==(const KvCacheIdentity&) const = default;
};

// The element type of the pool of a model computing in `compute`: bf16 for kBFloat16, else fp32.
constexpr KvElementType KvElementTypeFor(ComputeType compute) {
  return compute == ComputeType::kBFloat16 ? KvElementType::kBFloat16 : KvElementType::kFloat32;
}

struct KvCacheOptions {
  // Tokens per block. Must be > 0. 16 (vLLM's default) keeps the waste of a sequence's last,
  // partly filled block small while a block of one head (16 × 64 floats = 4 KiB in fp32, 2 KiB in
  // bf16) is long enough to stream.
  int64_t block_tokens = 16;
  // Byte budget of the whole arena; the pool holds budget_bytes / block_bytes() blocks (at least
  // one is required), so a bf16 pool holds twice the blocks of an fp32 one. Allocated once at
  // Create (pages are touched only when written, or by Prefault).
  int64_t budget_bytes = int64_t{256} << 20;
  // Longest sequence (cached tokens) any KvSequence may reach; longer growth is refused with
  // OutOfRange. Must be > 0.
  int64_t max_sequence_tokens = 4096;
  // Store K and V as int8 with a bf16 scale per token and head (KvElementType::kInt8) instead of
  // the compute type's elements. Default false.
  bool int8 = false;
  // Ask the kernel for transparent huge pages (madvise MADV_HUGEPAGE) on an arena of 2 MiB or
  // more, which is then 2 MiB-aligned: the first write to a 2 MiB piece maps it in one fault
  // instead of 512 (a first-touched 4 KiB page cost ~10 µs on the 2-core VMs measured, the
  // 2 MiB piece ~0.1-0.2 ms). Resident memory may then pass the touched blocks by up to one
  // huge page. No effect where the system's THP mode is "never". Default true.
  bool huge_pages = true;
};

// One sequence's share of the cache. A plain value owned by the caller; empty when default
// constructed. Only the pool's methods change it.
struct KvSequence {
  std::vector<int32_t> blocks;  // Block ids in token order: token t is in blocks[t / block_tokens].
  int64_t length = 0;           // Tokens written (cached).
};

class KvBlockPool {
 public:
  // InvalidArgument naming the field when `identity` or `options` is invalid (including a budget
  // smaller than one block); ResourceExhausted if the arena cannot be allocated.
  static absl::StatusOr<std::unique_ptr<KvBlockPool>> Create(const AttentionConfig& identity,
                                                             const KvCacheOptions& options);

  const KvCacheIdentity& identity() const { return identity_; }
  const KvCacheOptions& options() const { return options_; }
  int64_t head_dim() const { return identity_.d_model / identity_.num_heads; }
  int64_t total_blocks() const { return static_cast<int64_t>(capacity_); }
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  // Blocks ever handed out by Reserve: ids [0, high_water_blocks()). Blocks go out lowest id
  // first, and released ones before any never used, so the ids handed out are always a prefix.
  int64_t high_water_blocks() const { return high_water_; }
  // Blocks whose pages have been written: [0, touched_blocks()), handed out or prefaulted.
  // >= high_water_blocks().
  int64_t touched_blocks() const { return touched_; }
  // Of those, the blocks whose pages are still resident: not given back by DiscardFreeBlocks
  // since (a block handed out again is resident again).
  int64_t resident_blocks() const { return touched_ - discarded_; }
  // kInt8 for an int8 pool (KvCacheOptions::int8), else KvElementTypeFor(identity().compute_type):
  // what keys()/values() (or keys_bf16(), keys_int8() …) hold.
  KvElementType element_type() const { return layout_.element_type; }
  // Elements per block: 2 (K, V) × block_tokens × d_model.
  int64_t block_elements() const { return block_elements_; }
  // Bytes per block: block_elements() × 4 (fp32), 2 (bf16) or 1 (int8), plus an int8 block's
  // scales (2 × num_heads × block_tokens bf16). The budget counts these.
  int64_t block_bytes() const { return layout_.data_bytes + layout_.scale_bytes; }

  // OK when `config` is the model version this pool belongs to; FailedPrecondition naming the
  // mismatching field (expected and received) otherwise.
  absl::Status CheckIdentity(const AttentionConfig& config) const;

  // Makes room for `new_tokens` more tokens in `seq` (blocks appended to its table; its length is
  // unchanged: the caller writes the rows, then calls Commit). All or nothing: OutOfRange if
  // seq.length + new_tokens exceeds max_sequence_tokens, ResourceExhausted if the free list has
  // too few blocks — in both cases `seq` and the pool are exactly as before. O(new blocks).
  absl::Status Reserve(KvSequence& seq, int64_t new_tokens);
  // Sets seq.length to `length` (which the reserved blocks must cover) after its rows were written.
  void Commit(KvSequence& seq, int64_t length) const { seq.length = length; }
  // Returns the blocks of `seq` beyond what seq.length needs (undoes a Reserve not committed).
  void Trim(KvSequence& seq);
  // Returns every block of `seq` to the free list and empties it. O(blocks).
  void Release(KvSequence& seq);

  // Writes one byte in every page of the never-touched blocks [touched_blocks(), end), where end
  // is the least of `until_block`, total_blocks() and touched_blocks() + max_blocks, so that the
  // Reserve that first hands them out does not leave their first-touch page faults to the forward
  // pass writing them (~1,000 faults per 4 MiB, a millisecond or more, inside one step when many
  // sequences cross a block boundary together). Returns the blocks touched (0 when there are
  // none). The blocks hold no rows, before or after; blocks handed out are never written. O(pages).
  // With `stop`, returns before the next page once *stop is true (a page fault costs 1-10 µs):
  // only blocks whose every page was written count as touched, and a later call goes on from
  // the first block not finished.
  int64_t Prefault(int64_t until_block, int64_t max_blocks,
                   const std::atomic<bool>* stop = nullptr);

  // Gives the pages of up to `max_blocks` resident free blocks back to the system (madvise
  // MADV_DONTNEED), the least recently released first, so that a pool whose blocks were freed
  // stops holding memory it does not use (the arena is page-aligned). Their contents are gone; a
  // block is always written before it is read. A block given back no longer asks for huge pages
  // (MADV_NOHUGEPAGE), so the kernel's background collapse does not map it again around its
  // neighbours. Returns the blocks given back; 0 when the blocks are not a whole number of pages
  // (small models: their pages are shared). O(free blocks).
  int64_t DiscardFreeBlocks(int64_t max_blocks);

  // K (or V) rows of `head` in `block`: block_tokens × head_dim elements of element_type(),
  // token-major.
  const void* key_data(int32_t block, int64_t head) const { return Element(block, head); }
  const void* value_data(int32_t block, int64_t head) const {
    return Element(block, identity_.num_heads + head);
  }
  // The same, typed: keys()/values() only on an fp32 pool, keys_bf16()/values_bf16() only on a
  // bf16 pool (the other type's rows are not there; debug builds assert).
  const float* keys(int32_t block, int64_t head) const {
    assert(layout_.element_type == KvElementType::kFloat32);
    return static_cast<const float*>(key_data(block, head));
  }
  const float* values(int32_t block, int64_t head) const {
    assert(layout_.element_type == KvElementType::kFloat32);
    return static_cast<const float*>(value_data(block, head));
  }
  const uint16_t* keys_bf16(int32_t block, int64_t head) const {
    assert(layout_.element_type == KvElementType::kBFloat16);
    return static_cast<const uint16_t*>(key_data(block, head));
  }
  const uint16_t* values_bf16(int32_t block, int64_t head) const {
    assert(layout_.element_type == KvElementType::kBFloat16);
    return static_cast<const uint16_t*>(value_data(block, head));
  }
  // An int8 pool's rows and their scales: element i of token t of the block is
  // keys_int8(…)[Int8KeyOffset(block_tokens, head_dim, t, i)] × Int8Scale(key_scales(…)[t])
  // (values: Int8ValueOffset; int8_rows.h). Scales are null on other pools.
  const int8_t* keys_int8(int32_t block, int64_t head) const {
    assert(layout_.element_type == KvElementType::kInt8);
    return static_cast<const int8_t*>(key_data(block, head));
  }
  const int8_t* values_int8(int32_t block, int64_t head) const {
    assert(layout_.element_type == KvElementType::kInt8);
    return static_cast<const int8_t*>(value_data(block, head));
  }
  const uint16_t* key_scales(int32_t block, int64_t head) const { return Scales(block, head); }
  const uint16_t* value_scales(int32_t block, int64_t head) const {
    return Scales(block, identity_.num_heads + head);
  }

  // Copies the K and V rows of tokens [seq.length, seq.length + rows) from row-major [rows,
  // d_model] fp32 arrays (row stride k_ld / v_ld floats) into the blocks `seq` has reserved; a
  // bf16 pool stores each value rounded to the nearest bf16, ties to even (as oneDNN converts;
  // values must be finite, a NaN may be stored as an infinity), an int8 pool each head's row as
  // QuantizeInt8Row does (a row with a non-finite value reads back as NaN). Does not change
  // seq.length. The reservation must cover them.
  void Write(const KvSequence& seq, int64_t rows, const float* k, int64_t k_ld, const float* v,
             int64_t v_ld);

 private:
  // What a block of a pool holds, in bytes.
  struct Layout {
    KvElementType element_type;
    // A block's K and V rows in the main arena (a whole number of pages for large models).
    int64_t data_bytes;
    // A block's scales in the scale arena: 0 unless int8.
    int64_t scale_bytes;
  };
  static Layout LayoutFor(const AttentionConfig& identity, const KvCacheOptions& options);
  KvBlockPool(const KvCacheIdentity& identity, const KvCacheOptions& options, const Layout& layout,
              size_t capacity);
  struct Unmap {
    size_t bytes = 0;
    void operator()(std::byte* arena) const;
  };
  // An arena of `bytes` (rounded up to whole pages), 2 MiB-aligned with huge pages asked for
  // when `huge_pages` and it spans one. Throws std::bad_alloc when the mapping fails.
  static std::unique_ptr<std::byte, Unmap> MapArena(size_t bytes, bool huge_pages);
  int64_t HeadStride() const { return options_.block_tokens * head_dim(); }
  // Start of the `part`-th head_dim-wide run of `block` (K heads 0..h-1, then V heads).
  std::byte* Element(int32_t block, int64_t part) const {
    const int64_t element = block * block_elements_ + part * HeadStride();
    return arena_.get() + element * ElementBytes(layout_.element_type);
  }
  // The scales of the `part`-th row run of `block` (as Element), or null without scales.
  uint16_t* Scales(int32_t block, int64_t part) const {
    if (!scale_arena_) return nullptr;
    return reinterpret_cast<uint16_t*>(scale_arena_.get() + block * layout_.scale_bytes) +
           part * options_.block_tokens;
  }
  int64_t BlocksFor(int64_t tokens) const {
    return (tokens + options_.block_tokens - 1) / options_.block_tokens;
  }

  KvCacheIdentity identity_;
  KvCacheOptions options_;
  size_t capacity_;
  Layout layout_;
  int64_t block_elements_;
  // capacity_ × layout_.data_bytes, viewed as float, uint16_t or int8_t: an anonymous mapping,
  // page-aligned, its pages zero-filled on first touch.
  std::unique_ptr<std::byte, Unmap> arena_;
  // capacity_ × layout_.scale_bytes for an int8 pool, else null.
  std::unique_ptr<std::byte, Unmap> scale_arena_;
  std::vector<int32_t> free_;  // LIFO: the most recently released (cache-warm) block goes first.
  int64_t high_water_ = 0;     // See high_water_blocks().
  int64_t touched_ = 0;        // See touched_blocks().
  std::vector<bool> discarded_flags_;  // Per block below touched_: its pages were given back.
  int64_t discarded_ = 0;              // How many flags are set.
};

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_KV_CACHE_KV_BLOCK_POOL_H_
