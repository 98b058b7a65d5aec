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
#include <qkv/storage/aligned_buffer.hpp>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>
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

// Until set_arch succeeds, each call reads QKV_ARCH again, so a bad value
// fails every evaluation that needs the kernels, not only the first.
const kernel_table& active() {
  const kernel_table* t = chosen.load(std::memory_order_acquire);
  if (t == nullptr) {
    const char* forced = std::getenv("QKV_ARCH");
    t = find(forced == nullptr ? "" : forced, "QKV_ARCH");
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
// part of an attention, slot 2 for the key parts of decodes before their merge.
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

template <class T>
bool same_view(const strided<const T>& a, const strided<const T>& b) {
  return a.data == b.data && a.rows == b.rows && a.cols == b.cols && a.row_stride == b.row_stride &&
         a.col_stride == b.col_stride;
}

template <class T>
bool empty(const attention_problem<T>& p) {
  return p.q.rows == 0 || p.v.cols == 0;
}

// The independent pieces of work of a problem: its query blocks, or the key
// parts of its decode.
template <class T>
std::size_t pieces(const kernel_set<T>& k, const attention_problem<T>& p) {
  if (empty(p)) return 0;
  const std::size_t parts = k.attention_decode_parts(p.q.rows, p.k.rows);
  if (parts != 0) return parts;
  const std::size_t rows = k.attention_block_rows();
  return (p.q.rows + rows - 1) / rows;
}

// K and V of a group (problems that share them) packed into slot 0 of the
// calling thread, once for all the group's query blocks; null when every
// problem of the group decodes, reading K and V in place.
template <class T>
const T* pack_group(const kernel_set<T>& k, const attention_problem<T>* group, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) {
    const attention_problem<T>& p = group[i];
    if (empty(p) || k.attention_decode_parts(p.q.rows, p.k.rows) != 0) continue;
    T* shared = workspace<T>(k.attention_shared_size(p.q.rows, p.k.rows, p.q.cols, p.v.cols));
    k.attention_pack(p, shared);
    return shared;
  }
  return nullptr;
}

// A whole group on the calling thread.
template <class T>
void run_group(const kernel_set<T>& k, const attention_problem<T>* group, std::size_t count) {
  const T* shared = pack_group(k, group, count);
  for (std::size_t i = 0; i < count; ++i) {
    const attention_problem<T>& p = group[i];
    if (empty(p)) continue;
    const std::size_t n = p.q.rows, m = p.k.rows, dv = p.v.cols;
    T* scratch = workspace<T, 1>(k.attention_scratch_size(n, m, dv));
    const std::size_t parts = k.attention_decode_parts(n, m);
    if (parts != 0) {
      k.attention_decode(p, scratch, workspace<T, 2>(parts * k.attention_decode_part_size(n, dv)));
    } else {
      k.attention_blocks(p, shared, 0, pieces(k, p), scratch);
    }
  }
}

// A group packed by the caller, then the pieces of all its problems (query
// blocks, decode parts) spread over the pool; the decodes merged last, by
// the caller.
template <class T>
void spread_group(const kernel_set<T>& k, const attention_problem<T>* group, std::size_t count) {
  const T* shared = pack_group(k, group, count);
  // Problem i has pieces [first[i], first[i + 1]); a decoding one has its
  // parts at decoded + part_at[i].
  std::vector<std::size_t> first(count + 1, 0), part_at(count, 0);
  std::size_t part_total = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const attention_problem<T>& p = group[i];
    first[i + 1] = first[i] + pieces(k, p);
    if (!empty(p) && k.attention_decode_parts(p.q.rows, p.k.rows) != 0) {
      part_at[i] = part_total;
      part_total += (first[i + 1] - first[i]) * k.attention_decode_part_size(p.q.rows, p.v.cols);
    }
  }
  T* decoded = workspace<T, 2>(part_total);
  detail::parallel_for(first[count], [&](std::size_t piece) {
    const auto after = std::upper_bound(first.begin(), first.end(), piece);  // past the piece's problem
    const std::size_t i = static_cast<std::size_t>(after - first.begin()) - 1;
    const attention_problem<T>& p = group[i];
    const std::size_t n = p.q.rows, m = p.k.rows, dv = p.v.cols, b = piece - first[i];
    T* scratch = workspace<T, 1>(k.attention_scratch_size(n, m, dv));
    if (k.attention_decode_parts(n, m) != 0) {
      k.attention_decode_part(p, b, scratch, decoded + part_at[i] + b * k.attention_decode_part_size(n, dv));
    } else {
      k.attention_blocks(p, shared, b, b + 1, scratch);
    }
  });
  for (std::size_t i = 0; i < count; ++i) {
    const attention_problem<T>& p = group[i];
    if (!empty(p) && k.attention_decode_parts(p.q.rows, p.k.rows) != 0)
      k.attention_decode_merge(p, decoded + part_at[i], first[i + 1] - first[i]);
  }
}

// Consecutive problems with the same K and V form a group. With many groups
// (at least two per thread) each thread takes whole groups, packing into its
// own workspace; with few, the groups go one by one, each spread over the
// pool. A query block, or a decode part, is computed the same way whoever
// runs it and the parts merge in a fixed order, so the results depend neither
// on the number of threads nor on the way chosen.
template <class T>
void attention_impl(const attention_problem<T>* problems, std::size_t count) {
  const kernel_set<T>& k = set<T>();
  std::vector<std::size_t> starts;  // group g: problems [starts[g], starts[g + 1])
  for (std::size_t i = 0; i < count; ++i)
    if (i == 0 || !same_view(problems[i - 1].k, problems[i].k) || !same_view(problems[i - 1].v, problems[i].v))
      starts.push_back(i);
  starts.push_back(count);
  const std::size_t groups = starts.size() - 1;
  if (groups >= 2 * detail::pool_threads()) {
    detail::parallel_for(groups,
                         [&](std::size_t g) { run_group(k, problems + starts[g], starts[g + 1] - starts[g]); });
  } else {
    for (std::size_t g = 0; g < groups; ++g) spread_group(k, problems + starts[g], starts[g + 1] - starts[g]);
  }
}

}  // namespace

void attention(const attention_problem<float>& problem) { attention_impl(&problem, 1); }
void attention(const attention_problem<double>& problem) { attention_impl(&problem, 1); }
void attention(const attention_problem<float>* problems, std::size_t count) { attention_impl(problems, count); }
void attention(const attention_problem<double>* problems, std::size_t count) { attention_impl(problems, count); }
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

blocking active_blocking(std::size_t element_bytes) {
  return element_bytes == sizeof(float) ? set<float>().attention_sizes : set<double>().attention_sizes;
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

const char* active_arch() noexcept {
  const std::size_t i = active_arch_index();
  return i < arch_count ? arch_names[i].data() : "none";
}

}  // namespace qkv::kernels
