#include "thread_pool.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#endif

namespace qkv::detail {
namespace {

// Set on the pool's workers, and on a caller while its run is in flight: a
// nested parallel_for from either runs serially.
thread_local bool inside_pool = false;

// How long a worker that has finished, or a caller waiting for its workers,
// watches for the next step before it sleeps. Waking a sleeping thread took
// 23–55 µs on a 2-core virtual machine (the futex, then the host scheduling
// the idle virtual CPU), while the backward's two passes, a layer's heads
// and consecutive evaluations follow each other within microseconds.
constexpr std::chrono::microseconds watch_for{200};

// The CPUs this process may run on: its affinity mask (taskset, numactl,
// mpirun's binding) and, where a cgroup sets one, its CPU quota (containers
// limited to 1.5 CPUs get 2); the hardware's where neither can be read.
std::size_t allowed_cpus() {
  std::size_t n = std::thread::hardware_concurrency();
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) n = static_cast<std::size_t>(CPU_COUNT(&set));
  const auto quota = [](long long q, long long period) -> std::size_t {
    return q > 0 && period > 0 ? static_cast<std::size_t>((q + period - 1) / period) : 0;
  };
  std::size_t limit = 0;
  if (std::ifstream v2("/sys/fs/cgroup/cpu.max"); v2) {  // cgroup v2: "max 100000" or "150000 100000"
    std::string q;
    long long period = 0;
    if (v2 >> q >> period && q != "max") limit = quota(std::atoll(q.c_str()), period);
  } else if (std::ifstream q1("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"), p1("/sys/fs/cgroup/cpu/cpu.cfs_period_us"); q1 && p1) {
    long long q = -1, period = 0;
    if (q1 >> q && p1 >> period) limit = quota(q, period);
  }
  if (limit != 0 && limit < n) n = limit;
#endif
  return n == 0 ? 1 : n;
}

// Spins until ready() or watch_for has passed; returns ready(). Not at all
// where the pool has more threads than the CPUs it may use: a spinning
// thread would take the core a working one needs.
std::atomic<bool> spinning_allowed{true};
template <class Ready>
bool watch(Ready ready) {
  if (!spinning_allowed.load(std::memory_order_relaxed)) return ready();
  const auto until = std::chrono::steady_clock::now() + watch_for;
  for (unsigned spin = 0;; ++spin) {
    if (ready()) return true;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
    if (spin % 64 == 63 && std::chrono::steady_clock::now() > until) return ready();
  }
}

class pool {
 public:
  ~pool() { stop_workers(); }

  void resize(std::size_t n) {
    std::lock_guard<std::mutex> running(run_mutex_);  // not while a run is in flight
    stop_workers();
    threads_.store(n);
    started_ = false;  // workers start at the first run that needs them
  }

  std::size_t threads() const {
    const std::size_t n = threads_.load();
    return n == 0 ? hardware() : n;
  }

  void run(std::size_t count, const std::function<void(std::size_t)>& piece) {
    if (count <= 1 || inside_pool) return serial(count, piece);
    std::unique_lock<std::mutex> running(run_mutex_, std::try_to_lock);
    if (!running.owns_lock() || threads() <= 1) return serial(count, piece);
    if (!started_) start_workers();
    inside_pool = true;
    struct reset {
      ~reset() { inside_pool = false; }
    } reset_flag;

    {
      std::lock_guard<std::mutex> lock(mutex_);
      piece_ = &piece;
      count_ = count;
      next_.store(0);
      error_ = nullptr;
      busy_workers_ = workers_.size();
      ++generation_;
    }
    wake_.notify_all();
    drain();
    watch([this] { return busy_workers_.load(std::memory_order_acquire) == 0; });
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return busy_workers_ == 0; });
    piece_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  static std::size_t hardware() {
    static const std::size_t n = allowed_cpus();
    return n;
  }

  static void serial(std::size_t count, const std::function<void(std::size_t)>& piece) {
    for (std::size_t i = 0; i < count; ++i) piece(i);
  }

  // Takes pieces until none is left; records the first exception.
  void drain() {
    for (std::size_t i; (i = next_.fetch_add(1)) < count_;) {
      try {
        (*piece_)(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!error_) error_ = std::current_exception();
        next_.store(count_);  // the others stop taking pieces
      }
    }
  }

  // Called with run_mutex_ held, so generation_ cannot move meanwhile: each
  // worker starts having seen the current generation.
  void start_workers() {
    stop_ = false;
    const std::size_t n = threads(), seen = generation_;
    spinning_allowed.store(n <= hardware(), std::memory_order_relaxed);
    for (std::size_t t = 1; t < n; ++t) workers_.emplace_back([this, seen] { work(seen); });
    started_ = true;
  }

  void stop_workers() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& w : workers_) w.join();
    workers_.clear();
  }

  void work(std::size_t seen) {
    inside_pool = true;
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      lock.unlock();
      watch([&] { return stop_.load(std::memory_order_acquire) || generation_.load(std::memory_order_acquire) != seen; });
      lock.lock();
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      lock.unlock();
      drain();
      lock.lock();
      if (--busy_workers_ == 0) done_.notify_one();
    }
  }

  std::mutex run_mutex_;  // one run at a time; held by the caller of run()
  std::mutex mutex_;      // guards what follows
  std::condition_variable wake_, done_;
  std::vector<std::thread> workers_;
  std::atomic<std::size_t> threads_{0};  // 0: not set, the hardware's
  // Written under mutex_, read without it by watch().
  std::atomic<std::size_t> busy_workers_{0}, generation_{0};
  std::atomic<bool> stop_{false};
  bool started_ = false;
  const std::function<void(std::size_t)>* piece_ = nullptr;
  std::size_t count_ = 0;
  std::atomic<std::size_t> next_{0};
  std::exception_ptr error_;
};

pool& the_pool() {
  static pool p;
  return p;
}

}  // namespace

void parallel_for(std::size_t count, const std::function<void(std::size_t)>& piece) { the_pool().run(count, piece); }
void set_pool_threads(std::size_t n) { the_pool().resize(n); }
std::size_t pool_threads() { return the_pool().threads(); }

}  // namespace qkv::detail
