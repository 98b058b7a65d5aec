// The sum of count 2-byte values, read and converted with this machine's
// widest vectors (bench/kv_read_floor.cpp).
#pragma once

#include <qkv/numeric/float16.hpp>

#include <cstddef>

namespace bench {
float sum_converted(const qkv::bf16* p, std::size_t count);
float sum_converted(const qkv::f16* p, std::size_t count);
}  // namespace bench
