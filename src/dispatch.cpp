// Picks the kernels of the best instruction set this CPU has, at first use,
// and forwards each call of qkv/kernels/api.hpp to them. QKV_ARCH=avx512bw|
// avx2|sse2|neon64, or set_arch(name), forces one (for tests and
// benchmarks); forcing one the CPU lacks is an error, never a silent fallback.
#include "kernel_table.hpp"
#include "thread_pool.hpp"

#include <qkv/kernels/api.hpp>
#include <qkv/storage/aligned_buffer.hpp>


#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>

namespace qkv::kernels {
namespace {

struct candidate {
  const char* env_name;
  const kernel_table* table;
  bool supported;
};

// What the CPU and the OS support. Not xsimd::available_architectures():
// xsimd 8.1 reads SSE2 from the XSAVE bit and AVX from the wrong CPUID leaf,
// and checks no OS support, so it finds no SSE2 on a Nehalem. The compiler's
// own check reads the right bits and the OS-enabled register state (XGETBV).
struct cpu_features {
  bool avx512bw = false, avx2_fma = false, sse2 = false, neon64 = false;
};

cpu_features detect() {
  cpu_features f;
#if defined(__x86_64__)
  __builtin_cpu_init();
  f.sse2 = true;  // part of x86-64
  f.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  f.avx512bw = f.avx2_fma && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
               __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw");
#elif defined(__aarch64__)
  f.neon64 = true;  // part of AArch64
#endif
  return f;
}

const kernel_table* find(std::string_view name) {
  const cpu_features cpu = detect();
  const candidate candidates[] = {
      // best first
      {"avx512bw", avx512bw_table, cpu.avx512bw},
      {"avx2", avx2_table, cpu.avx2_fma},
      {"sse2", sse2_table, cpu.sse2},
      {"neon64", neon64_table, cpu.neon64},
  };
  for (const candidate& c : candidates) {
    if (name.empty() ? (c.table != nullptr && c.supported) : name == c.env_name) {
      if (c.table == nullptr || !c.supported) {
        throw std::runtime_error("qkv: " + std::string(name) + " was asked for, but this CPU or build has no " +
                                 std::string(name));
      }
      return c.table;
    }
  }
  if (name.empty()) throw std::runtime_error("qkv: no kernel instruction set fits this CPU");
  throw std::runtime_error("qkv: '" + std::string(name) + "' is not one of avx512bw, avx2, sse2, neon64");
}

std::atomic<const kernel_table*> chosen{nullptr};

const kernel_table& active() {
  const kernel_table* t = chosen.load(std::memory_order_acquire);
  if (t == nullptr) {
    const char* forced = std::getenv("QKV_ARCH");
    t = find(forced == nullptr ? "" : forced);
    chosen.store(t, std::memory_order_release);
  }
  return *t;
}

template <class T>
const kernel_set<T>& set() {
  if constexpr (sizeof(T) == sizeof(float)) {
    return active().f32;
  } else {
    return active().f64;
  }
}

// Scratch space, kept per thread and grown on demand: slot 0 for the
// packed operands of a product or an attention, slot 1 for a thread's own
// part of an attention.
template <class T, int Slot = 0>
T* workspace(std::size_t elements) {
  thread_local detail::aligned_buffer<T> buffer;
  if (buffer.size() < elements) buffer = detail::aligned_buffer<T>(elements, detail::aligned_buffer<T>::uninitialized);
  return buffer.data();
}

template <class T>
void gemm_impl(strided<const T> a, strided<const T> b, T* c, std::ptrdiff_t ldc) {
  const kernel_set<T>& k = set<T>();
  k.gemm(a, b, c, ldc, workspace<T>(k.gemm_workspace(a.rows, b.cols, a.cols)));
}

// K and V packed once by the caller, then the query blocks spread over the
// pool; each block is computed alike whichever thread takes it, so the
// result does not depend on the number of threads.
template <class T>
void attention_impl(const attention_problem<T>& p) {
  const kernel_set<T>& k = set<T>();
  const std::size_t n = p.q.rows, m = p.k.rows, dk = p.q.cols, dv = p.v.cols;
  if (n == 0 || dv == 0) return;
  const std::size_t shared_size = k.attention_shared_size(n, m, dk, dv);
  const std::size_t scratch_size = k.attention_scratch_size(n, m, dv);
  if (shared_size == 0) return k.attention_decode(p, workspace<T, 1>(scratch_size));
  T* shared = workspace<T>(shared_size);
  k.attention_pack(p, shared);
  const std::size_t rows = k.attention_block_rows(), blocks = (n + rows - 1) / rows;
  detail::parallel_for(
      blocks, [&](std::size_t b) { k.attention_blocks(p, shared, b, b + 1, workspace<T, 1>(scratch_size)); });
}

}  // namespace

void attention(const attention_problem<float>& problem) { attention_impl(problem); }
void attention(const attention_problem<double>& problem) { attention_impl(problem); }
void gemm(strided<const float> a, strided<const float> b, float* c, std::ptrdiff_t ldc) { gemm_impl(a, b, c, ldc); }
void gemm(strided<const double> a, strided<const double> b, double* c, std::ptrdiff_t ldc) { gemm_impl(a, b, c, ldc); }
void softmax_rows(strided<float> x) { set<float>().softmax_rows(x); }
void softmax_rows(strided<double> x) { set<double>().softmax_rows(x); }
void multiply(strided<float> x, float s) { set<float>().multiply(x, s); }
void multiply(strided<double> x, double s) { set<double>().multiply(x, s); }
void divide(strided<float> x, float s) { set<float>().divide(x, s); }
void divide(strided<double> x, double s) { set<double>().divide(x, s); }
void add(strided<float> x, strided<const float> y) { set<float>().add(x, y); }
void add(strided<double> x, strided<const double> y) { set<double>().add(x, y); }
void subtract(strided<float> x, strided<const float> y) { set<float>().subtract(x, y); }
void subtract(strided<double> x, strided<const double> y) { set<double>().subtract(x, y); }
void copy(strided<const float> src, strided<float> dst) { set<float>().copy(src, dst); }
void copy(strided<const double> src, strided<double> dst) { set<double>().copy(src, dst); }

void set_threads(std::size_t n) { detail::set_pool_threads(n); }
std::size_t threads() { return detail::pool_threads(); }

void set_arch(std::string_view name) { chosen.store(find(name), std::memory_order_release); }

const char* active_arch() noexcept {
  try {
    return active().name;
  } catch (...) {
    return "none";
  }
}

}  // namespace qkv::kernels
