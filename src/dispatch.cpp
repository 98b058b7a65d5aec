// Picks the kernels of the best instruction set of arch_list this CPU runs,
// at first use, and forwards each call of qkv/kernels/api.hpp to them.
// QKV_ARCH=name (read at first use) or set_arch(name) forces one, for tests
// and benchmarks: a name not in the list is std::invalid_argument, one this
// CPU or build lacks std::runtime_error, thrown by the call that uses the
// name; never a silent fallback.
#include "kernel_table.hpp"
#include "thread_pool.hpp"

#include <qkv/kernels/api.hpp>
#include <qkv/kernels/arch_list.hpp>
#include <qkv/storage/thread_scratch.hpp>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace qkv::kernels {
namespace {

// The kernels of instruction set i of arch_list; null where this build has none.
const kernel_table* table(std::size_t i) noexcept {
  const kernel_table* found = nullptr;
  std::size_t j = 0;
  find_arch([&](auto isa) {
    using isa_t = typename decltype(isa)::type;
    if (j++ != i) return false;
    if constexpr (isa_t::built) found = &kernels_of<isa_t>();
    return true;
  });
  return found;
}

// "a, b, c": the names of the instruction sets i for which keep(i) holds.
template <class Keep>
std::string names(Keep keep) {
  std::string list;
  for (std::size_t i = 0; i < arch_count; ++i)
    if (keep(i)) list += (list.empty() ? "" : ", ") + std::string(arch_names[i]);
  return list;
}

// The kernels to run for `name` ("" for the best this CPU runs), which came
// from `source` (set_arch or QKV_ARCH).
const kernel_table* find(std::string_view name, std::string_view source) {
  if (name.empty()) {
    for (std::size_t i = 0; i < arch_count; ++i)
      if (arch_runs_here(i)) return table(i);
    throw std::runtime_error("qkv: no kernel instruction set of this build fits this CPU");
  }
  const std::size_t i = arch_index(name);
  if (i == arch_count) {
    throw std::invalid_argument("qkv: " + std::string(source) + ": '" + std::string(name) +
                                "' is not an instruction set; the names are " + names([](std::size_t) { return true; }));
  }
  if (!arch_runs_here(i)) {
    throw std::runtime_error("qkv: " + std::string(source) + ": this CPU or build has no " + std::string(name) +
                             "; it runs " + names(arch_runs_here));
  }
  return table(i);
}

std::atomic<const kernel_table*> chosen{nullptr};

// QKV_BF16_PAIRS's value: "1", "0", or unset (or empty) for the measured choice.
std::string_view pairs_setting() {
  const char* v = std::getenv("QKV_BF16_PAIRS");
  return v == nullptr ? std::string_view() : std::string_view(v);
}

// Until set_arch succeeds, each call reads QKV_ARCH again, so a bad value
// fails every evaluation that needs the kernels, not only the first.
const kernel_table& active() {
  const kernel_table* t = chosen.load(std::memory_order_acquire);
  if (t == nullptr) {
    const std::string_view pairs = pairs_setting();
    if (!pairs.empty() && pairs != "0" && pairs != "1")
      throw std::invalid_argument("qkv: QKV_BF16_PAIRS: '" + std::string(pairs) + "' is not 0 or 1");
    const char* forced = std::getenv("QKV_ARCH");
    t = find(forced == nullptr ? "" : forced, "QKV_ARCH");
    chosen.store(t, std::memory_order_release);
  }
  return *t;
}

}  // namespace

int bf16_pairs_forced() {
  const std::string_view pairs = pairs_setting();
  return pairs == "1" ? 1 : (pairs == "0" ? 0 : -1);
}

template <class T>
const kernel_set<T>& active_kernels() {
  if constexpr (sizeof(T) == sizeof(float)) {
    return active().f32;
  } else {
    return active().f64;
  }
}
template const kernel_set<float>& active_kernels<float>();
template const kernel_set<double>& active_kernels<double>();

template <class S>
const attention_entries<float, S>& active_attention() {
  if constexpr (std::is_same_v<S, bf16>) return active().f32_bf16;
  else if constexpr (std::is_same_v<S, f16>) return active().f32_f16;
  else return active().f32.attention;
}
template const attention_entries<float, float>& active_attention<float>();
template const attention_entries<float, bf16>& active_attention<bf16>();
template const attention_entries<float, f16>& active_attention<f16>();

namespace {

template <class T>
const kernel_set<T>& set() {
  return active_kernels<T>();
}

// The packing buffer of a product, kept per thread and grown on demand.
template <class T>
T* workspace(std::size_t elements) {
  return detail::thread_scratch<T, detail::scratch_slot::product_packing>(elements);
}

template <class T>
void gemm_impl(strided<const T> a, strided<const T> b, T* c, std::ptrdiff_t ldc) {
  const kernel_set<T>& k = set<T>();
  k.gemm(a, b, c, ldc, workspace<T>(k.gemm_workspace(a.rows, b.cols, a.cols)));
}

}  // namespace

void gemm(strided<const float> a, strided<const float> b, float* c, std::ptrdiff_t ldc) { gemm_impl(a, b, c, ldc); }
void gemm(strided<const double> a, strided<const double> b, double* c, std::ptrdiff_t ldc) { gemm_impl(a, b, c, ldc); }
void softmax_rows(strided<float> x) { set<float>().softmax_rows(x, -std::numeric_limits<float>::infinity()); }
void softmax_rows(strided<double> x) { set<double>().softmax_rows(x, -std::numeric_limits<double>::infinity()); }
void softmax_rows(strided<float> x, float sink) { set<float>().softmax_rows(x, sink); }
void softmax_rows(strided<double> x, double sink) { set<double>().softmax_rows(x, sink); }
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
void widen(strided<const bf16> src, strided<float> dst) { active().widen_bf16(src, dst); }
void widen(strided<const f16> src, strided<float> dst) { active().widen_f16(src, dst); }

blocking active_blocking(std::size_t element_bytes) {
  return element_bytes == sizeof(float) ? set<float>().attention.sizes : set<double>().attention.sizes;
}

void set_threads(std::size_t n) { detail::set_pool_threads(n); }
std::size_t threads() { return detail::pool_threads(); }

void set_arch(std::string_view name) { chosen.store(find(name, "set_arch"), std::memory_order_release); }

std::size_t active_arch_index() noexcept {
  try {
    return active().arch;
  } catch (...) {
    return arch_count;
  }
}

bool bf16_pairs_active() noexcept {
  try {
    return active().bf16_pairs;
  } catch (...) {
    return false;
  }
}

const char* active_arch() noexcept {
  const std::size_t i = active_arch_index();
  return i < arch_count ? arch_names[i].data() : "none";
}

}  // namespace qkv::kernels
