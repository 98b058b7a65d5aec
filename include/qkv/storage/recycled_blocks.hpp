// Blocks of memory that a thread's evaluations take for per-call scratch
// and give back when done (aligned_buffer's `recycled` scratch).
#pragma once

#include <cstddef>
#include <new>
#include <utility>

namespace qkv::detail {

inline constexpr std::size_t storage_alignment = 64;  // a cache line, and one AVX-512 vector

// Blocks that a thread's evaluations take for per-call copies (a 2-byte
// operand widened to float) and give back when done, so that the next call
// finds its pages mapped: new pages cost each call 0.5–4 ms at T = 4096 on a
// virtual machine. At most `kept` blocks and `most_bytes` in all per thread.
class recycled_blocks {
 public:
  static void* take(std::size_t bytes) {
    recycled_blocks& mine = of_thread();
    block* best = nullptr;
    for (block& b : mine.blocks_)
      if (b.data != nullptr && b.bytes >= bytes && b.bytes <= 2 * bytes && (best == nullptr || b.bytes < best->bytes))
        best = &b;
    if (best == nullptr) return ::operator new[](bytes, std::align_val_t{storage_alignment});
    mine.total_ -= best->bytes;
    return std::exchange(best->data, nullptr);
  }
  // bytes: what take was asked for (a block kept holds at least that).
  static void give(void* p, std::size_t bytes) noexcept {
    if (gone) return release(p);  // (a buffer outliving its thread's blocks)
    recycled_blocks& mine = of_thread();
    block* slot = nullptr;
    for (block& b : mine.blocks_)
      if (b.data == nullptr) slot = &b;
    if (slot == nullptr || bytes > most_bytes - mine.total_) return release(p);
    *slot = {p, bytes};
    mine.total_ += bytes;
  }
  ~recycled_blocks() {
    gone = true;
    for (block& b : blocks_)
      if (b.data != nullptr) release(b.data);
  }

 private:
  static constexpr std::size_t kept = 4, most_bytes = std::size_t(64) << 20;
  struct block {
    void* data = nullptr;
    std::size_t bytes = 0;
  };
  static void release(void* p) noexcept { ::operator delete[](p, std::align_val_t{storage_alignment}); }
  static recycled_blocks& of_thread() {
    thread_local recycled_blocks blocks;
    return blocks;
  }
  static inline thread_local bool gone = false;
  block blocks_[kept];
  std::size_t total_ = 0;
};

}  // namespace qkv::detail
