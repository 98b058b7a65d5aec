// Non-blocking transfers of whole buffers between ranks. MPI counts are
// ints: a buffer goes in pieces of at most 1 GiB, each a request of its own.
// Messages between two ranks with one tag arrive in the order they were
// sent (MPI's non-overtaking rule), which is what lets every phase of the
// ring reuse its tags.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <vector>

namespace qkv::mpi::detail {

inline constexpr std::size_t piece_bytes = std::size_t(1) << 30;

// call(p, bytes) for each piece of [p, p + bytes); once with 0 bytes for an
// empty buffer, so that both sides post the same number of requests.
template <class Byte, class Call>
void in_pieces(Byte* p, std::size_t bytes, Call call) {
  std::size_t at = 0;
  do {
    const std::size_t len = bytes - at < piece_bytes ? bytes - at : piece_bytes;
    call(p + at, static_cast<int>(len));
    at += len;
  } while (at < bytes);
}

template <class S>
void post_send(const S* x, std::size_t count, int to, int tag, MPI_Comm comm, std::vector<MPI_Request>& reqs) {
  in_pieces(reinterpret_cast<const char*>(x), count * sizeof(S), [&](const char* p, int len) {
    reqs.emplace_back();
    MPI_Isend(p, len, MPI_BYTE, to, tag, comm, &reqs.back());
  });
}
template <class S>
void post_receive(S* x, std::size_t count, int from, int tag, MPI_Comm comm, std::vector<MPI_Request>& reqs) {
  in_pieces(reinterpret_cast<char*>(x), count * sizeof(S), [&](char* p, int len) {
    reqs.emplace_back();
    MPI_Irecv(p, len, MPI_BYTE, from, tag, comm, &reqs.back());
  });
}
template <class S>
void post_send(const std::vector<S>& x, int to, int tag, MPI_Comm comm, std::vector<MPI_Request>& reqs) {
  post_send(x.data(), x.size(), to, tag, comm, reqs);
}
template <class S>
void post_receive(std::vector<S>& x, int from, int tag, MPI_Comm comm, std::vector<MPI_Request>& reqs) {
  post_receive(x.data(), x.size(), from, tag, comm, reqs);
}

// Lets the library move the posted transfers along (between computations).
inline void progress(std::vector<MPI_Request>& reqs) {
  int done = 0;
  if (!reqs.empty()) MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE);
}

inline void finish(std::vector<MPI_Request>& reqs) {
  if (!reqs.empty()) MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE);
  reqs.clear();
}

}  // namespace qkv::mpi::detail
