// Owns the NCCL communicator backend (see nccl_communicator.h): libnccl resolved with dlopen, ncclCommInitAll for
// the group, ncclAllReduce / ncclAllGather on the rank's stream.
#include "runtime/nccl_communicator.h"

#include "core/env_options.h"

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cstddef>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "device/cuda_check.h"
#include "device/device.h"
#include "kernels/cuda/p2p_all_reduce.h"

#ifndef SSMSERVE_HAVE_NCCL
#define SSMSERVE_HAVE_NCCL 0
#endif
#if SSMSERVE_HAVE_NCCL
#include <nccl.h>
#endif

#ifndef SSMSERVE_NCCL_LIBRARY
#define SSMSERVE_NCCL_LIBRARY ""
#endif

namespace ssmserve::cuda {

bool nccl_compiled() { return SSMSERVE_HAVE_NCCL != 0; }

std::vector<std::string> nccl_library_candidates() {
  std::vector<std::string> c;
  if (!env_options().nccl_lib.empty()) c.push_back(env_options().nccl_lib);
  if (*SSMSERVE_NCCL_LIBRARY) c.push_back(SSMSERVE_NCCL_LIBRARY);
  c.push_back("libnccl.so.2");
  c.push_back("libnccl.so");
  return c;
}

#if SSMSERVE_HAVE_NCCL
namespace {

/// The NCCL entry points we use, resolved once from the first loadable library.
struct NcclApi {
  decltype(&::ncclCommInitAll) comm_init_all = nullptr;
  decltype(&::ncclCommDestroy) comm_destroy = nullptr;
  decltype(&::ncclAllReduce) all_reduce = nullptr;
  decltype(&::ncclAllGather) all_gather = nullptr;
  decltype(&::ncclGetErrorString) error_string = nullptr;
  decltype(&::ncclGetVersion) get_version = nullptr;
  std::string path;
};

const NcclApi& nccl() {
  static const NcclApi api = [] {
    NcclApi a;
    std::string tried;
    void* h = nullptr;
    for (const std::string& p : nccl_library_candidates()) {
      h = dlopen(p.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (h) {
        a.path = p;
        break;
      }
      tried += (tried.empty() ? "" : ", ") + p;
    }
    SSM_CHECK(h, "NCCL: cannot load libnccl (tried {}); set SSMSERVE_NCCL_LIB to libnccl.so.2 (e.g. the pip wheel "
                 "nvidia-nccl-cu13's nvidia/nccl/lib/libnccl.so.2)", tried);
    auto sym = [&](const char* name) {
      void* f = dlsym(h, name);
      SSM_CHECK(f, "NCCL: {} has no symbol {}", a.path, name);
      return f;
    };
    a.comm_init_all = reinterpret_cast<decltype(a.comm_init_all)>(sym("ncclCommInitAll"));
    a.comm_destroy = reinterpret_cast<decltype(a.comm_destroy)>(sym("ncclCommDestroy"));
    a.all_reduce = reinterpret_cast<decltype(a.all_reduce)>(sym("ncclAllReduce"));
    a.all_gather = reinterpret_cast<decltype(a.all_gather)>(sym("ncclAllGather"));
    a.error_string = reinterpret_cast<decltype(a.error_string)>(sym("ncclGetErrorString"));
    a.get_version = reinterpret_cast<decltype(a.get_version)>(sym("ncclGetVersion"));
    return a;
  }();
  return api;
}

void nccl_check(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return;
  fail("NCCL error {} ({}) in {}", static_cast<int>(r), nccl().error_string(r), what);
}

/// One rank: its ncclComm_t, its device and the stream its collectives go on; all-reduces and all-gathers up to
/// kP2pMaxCount floats take the one-shot peer-to-peer kernels when the group set it up (p2p.world > 1).
class NcclRank final : public dist::Communicator {
 public:
  NcclRank(ncclComm_t comm, int rank, int world, const P2pAllReduceRank& p2p)
      : comm_(comm), rank_(rank), world_(world), p2p_(p2p) {}
  ~NcclRank() override {
    if (comm_) nccl().comm_destroy(comm_);
  }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  void set_stream(void* s) override { stream_ = static_cast<cudaStream_t>(s); }

  void all_reduce_sum(float* data, int64_t count) override {
    SSM_CHECK(count >= 0, "all_reduce_sum: negative count {}", count);
    if (world_ == 1 || count == 0) return;
    if (p2p_.world > 1 && count <= p2p_.max_count) {
      SSM_CUDA_CHECK(p2p_all_reduce_sum(p2p_, data, count, stream_));
      return;
    }
    nccl_check(nccl().all_reduce(data, data, static_cast<size_t>(count), ncclFloat32, ncclSum, comm_, stream_), "ncclAllReduce");
  }

  void all_gather(const float* send, int64_t count, float* recv) override {
    SSM_CHECK(count >= 0, "all_gather: negative count {}", count);
    if (count == 0) return;
    if (p2p_.world > 1 && count <= p2p_.max_count) {
      SSM_CUDA_CHECK(p2p_all_gather(p2p_, send, count, recv, stream_));
      return;
    }
    nccl_check(nccl().all_gather(send, recv, static_cast<size_t>(count), ncclFloat32, comm_, stream_), "ncclAllGather");
  }

  void barrier() override {
    if (!scratch_.data()) scratch_ = DeviceBuffer(sizeof(float));
    all_reduce_sum(static_cast<float*>(scratch_.data()), 1);
    SSM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

 private:
  ncclComm_t comm_ = nullptr;
  int rank_ = 0, world_ = 1;
  cudaStream_t stream_ = nullptr;
  DeviceBuffer scratch_;
  P2pAllReduceRank p2p_;
};

/// Floats per one-shot receive buffer (8 MB, vLLM's custom all-reduce limit): decode steps' all-reduces (x_proj /
/// out_proj rows of up to a few hundred sequences) and logits all-gathers fit; larger ones (prefill) go to NCCL.
constexpr int64_t kP2pMaxCount = int64_t{1} << 21;

/// Whether every pair of GPUs 0..world-1 can access each other (and SSMSERVE_TP_P2P_ALLREDUCE is not "0").
bool p2p_usable(int world) {
  if (!env_options().tp_p2p_allreduce) return false;
  if (world < 2 || world > kP2pMaxRanks) return false;
  for (int a = 0; a < world; ++a)
    for (int b = 0; b < world; ++b) {
      int ok = 0;
      if (a != b && (cudaDeviceCanAccessPeer(&ok, a, b) != cudaSuccess || !ok)) return false;
    }
  return true;
}

}  // namespace

NcclGroup::NcclGroup(int world_size) {
  SSM_CHECK(world_size >= 1, "NcclGroup: world size must be >= 1 (got {})", world_size);
  const int n = device_count();
  SSM_CHECK(n >= world_size, "--tensor-parallel-size {} on cuda needs {} GPUs; {} visible", world_size, world_size, n);
  const NcclApi& api = nccl();
  std::vector<ncclComm_t> comms(static_cast<size_t>(world_size));
  std::vector<int> devs(static_cast<size_t>(world_size));
  for (int r = 0; r < world_size; ++r) devs[r] = r;
  nccl_check(api.comm_init_all(comms.data(), world_size, devs.data()), "ncclCommInitAll");
  std::vector<P2pAllReduceRank> p2p(static_cast<size_t>(world_size));
  if (p2p_usable(world_size)) {
    int prev = 0;
    SSM_CUDA_CHECK(cudaGetDevice(&prev));
    P2pAllReduceRank shared;
    shared.world = world_size, shared.max_count = kP2pMaxCount;
    for (int r = 0; r < world_size; ++r) {
      SSM_CUDA_CHECK(cudaSetDevice(r));
      for (int p = 0; p < world_size; ++p)
        if (p != r) {
          const cudaError_t e = cudaDeviceEnablePeerAccess(p, 0);
          if (e == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError();
          else SSM_CUDA_CHECK(e);
        }
      // Per rank: the receive buffers, the flags, the epoch counters, zeroed.
      const int64_t bytes = p2p_buffer_bytes(world_size, kP2pMaxCount);
      void* base = nullptr;
      SSM_CUDA_CHECK(cudaMalloc(&base, static_cast<size_t>(bytes)));
      SSM_CUDA_CHECK(cudaMemset(base, 0, static_cast<size_t>(bytes)));
      p2p_memory_.push_back(base);
      shared.recv[r] = static_cast<float*>(base);
      shared.flags[r] = reinterpret_cast<uint64_t*>(static_cast<std::byte*>(base) + p2p_flags_offset(world_size, kP2pMaxCount));
    }
    for (int r = 0; r < world_size; ++r) {
      p2p[r] = shared;
      p2p[r].rank = r;
      p2p[r].epoch = shared.flags[r] + kP2pBlocks * kP2pMaxRanks;
    }
    SSM_CUDA_CHECK(cudaDeviceSynchronize());
    SSM_CUDA_CHECK(cudaSetDevice(prev));
  }
  for (int r = 0; r < world_size; ++r) ranks_.push_back(std::make_unique<NcclRank>(comms[r], r, world_size, p2p[r]));
}

#else  // built without nccl.h

NcclGroup::NcclGroup(int world_size) {
  fail("--tensor-parallel-size {} on cuda: this build has no NCCL backend (nccl.h was not found at configure time)",
       world_size);
}

#endif

NcclGroup::~NcclGroup() {
  ranks_.clear();
  for (void* p : p2p_memory_) cudaFree(p);
}

dist::Communicator& NcclGroup::communicator(int rank) {
  SSM_CHECK(rank >= 0 && rank < world_size(), "NcclGroup: rank {} outside [0, {})", rank, world_size());
  return *ranks_[rank];
}

}  // namespace ssmserve::cuda
