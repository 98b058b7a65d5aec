#include "thread_pool.hpp"

#include <atomic>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace qkv::detail {
namespace {

// Set on the pool's workers, and on a caller while its run is in flight: a
// nested parallel_for from either runs serially.
thread_local bool inside_pool = false;

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
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return busy_workers_ == 0; });
    piece_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  static std::size_t hardware() {
    const unsigned h = std::thread::hardware_concurrency();
    return h == 0 ? 1 : h;
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
  std::size_t busy_workers_ = 0, generation_ = 0;
  bool stop_ = false, started_ = false;
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
