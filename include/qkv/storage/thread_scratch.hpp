// The calling thread's scratch buffers: one per element type and slot, grown
// on demand and kept for the thread's next call (a new buffer each call spent
// a few percent of a kernel's time faulting its pages in). Written before it
// is read; never shrunk.
#pragma once

#include "aligned_buffer.hpp"

#include <cstddef>

namespace qkv::detail {

// The buffers one thread may hold at once, one list so that no two users
// share one by accident.
enum class scratch_slot {
  packed_kv,        // the forward's packed K and V (kernels/attention_schedule.hpp)
  block,            // a query block's scores and sums
  kept,             // a decode's partial results before they merge
  backward_tile,    // the backward's tile buffers (kernels/backward_schedule.hpp)
  backward_shared,  // the backward's packed operands and sums
  row_states,       // the row-block path's key-block states (kernels/attention_rows.hpp)
  row_scores,       // the row-block path's scores
  pair_words,       // the bf16-pair prefill's queries and weights as pairs
  functor_block,    // a block's scratch for a kernel with the user's functors
  product_packing,  // the matrix product's packed panels (src/dispatch.cpp)
};

// allocation_meter counts of a slot the most asked of it since its
// measurement began (the buffer itself lives on).
template <class T, scratch_slot Slot>
T* thread_scratch(std::size_t elements) {
  thread_local aligned_buffer<T> buffer;
  thread_local std::size_t counted = 0;
  thread_local unsigned epoch = 0;
  if (const unsigned now = allocation_meter::epoch(); now != epoch) epoch = now, counted = 0;
  if (elements > counted) allocation_meter::add((elements - counted) * sizeof(T)), counted = elements;
  if (buffer.size() < elements) buffer = aligned_buffer<T>(elements, aligned_buffer<T>::unmetered);
  return buffer.data();
}

}  // namespace qkv::detail
