// Owns what the GPU model runners share: device copies of weights in the GEMM dtype, grow-only device scratch,
// the once-per-step upload of the batch metadata, and the stack around the mixers (embedding, final norm, LM head
// on the requested rows, logits download).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "core/dtype.h"
#include "device/device.h"
#include "kernels/cuda/gemm.h"
#include "model/forward_batch.h"
#include "model/weight.h"

namespace ssmserve::cuda {

/// A weight matrix [rows, cols] on the device in `dtype` (BF16 or F32).
struct DevWeight {
  DeviceBuffer buf;
  int64_t rows = 0, cols = 0;
  DType dtype = DType::BF16;
};

/// Converts `w` (F32 or BF16 on the host) to `dtype` and uploads it.
DevWeight upload_weight(const Weight& w, DType dtype);

/// A device buffer that only grows (by 1.5x) and is reused across steps.
struct Scratch {
  DeviceBuffer buf;
  void* get(size_t bytes) {
    if (buf.bytes() < bytes) buf = DeviceBuffer(std::max(bytes, buf.bytes() * 3 / 2));
    return buf.data();
  }
  float* f32(size_t n) { return static_cast<float*>(get(n * 4)); }
};

/// One step's metadata on the device: views into one buffer filled by a single host-to-device copy.
struct StepMeta {
  const int32_t* input_ids = nullptr;           ///< [T]
  const int32_t* query_start_loc_p = nullptr;   ///< [num_prefills + 1]
  const int32_t* state_indices_p = nullptr;     ///< [num_prefills]
  const int32_t* state_indices_d = nullptr;     ///< [num_decode_rows]
  const int32_t* logits_indices = nullptr;      ///< [n_logits]
  const int32_t* cu_chunk_seqlen_p = nullptr;   ///< [nchunks + 1]
  const int32_t* seq_idx_p = nullptr;           ///< [nchunks]
  const int32_t* last_chunk_indices_p = nullptr;///< [num_prefills]
  const uint8_t* has_initial_states_p = nullptr;///< [num_prefills]
};

/// Packs and uploads the step's arrays (asynchronously on `stream`; the host staging stays valid until the
/// next call). Throws Error on a device failure.
class StepMetaUploader {
 public:
  StepMeta upload(const ForwardBatch& batch, cudaStream_t stream);
  const void* device_buffer() const { return dev_.data(); }

 private:
  std::vector<uint8_t> host_;
  DeviceBuffer dev_;
};

/// The embedding -> mixers -> final norm -> LM head frame shared by the runners.
struct LmFrame {
  DevWeight embedding, lm_head;
  bool tied = false;
  DeviceBuffer norm_f;
  Scratch fin, gath, cast, logits;

  /// Sizes the scratch for T tokens and n_logits rows (so a captured step never reallocates).
  void reserve(int64_t T, int64_t H, int64_t V, int64_t n_logits);
  /// hidden [T, H] fp32 = embedding rows of meta.input_ids.
  void embed(const StepMeta& m, int64_t T, int64_t H, float* hidden, cudaStream_t s);
  /// Enqueues device logits [n_logits, V] = lm_head(rms_norm(hidden + last_out)) on the requested rows.
  void enqueue_head(const StepMeta& m, int64_t T, int64_t H, int64_t V, float eps, const float* last_out,
                    float* hidden, int64_t n_logits, GemmHandle& gemm, cudaStream_t s);
  /// Copies the logits to the host and waits for the stream (the step's one synchronization).
  void download(int64_t n_logits, int64_t V, float* logits_host, cudaStream_t s);
  /// Device pointers the enqueued work depends on (for DecodeGraphs signatures).
  void pointers(std::vector<const void*>& out) const;
};

/// CUDA graphs for decode-only steps (issue 7 step 4): a step's device work, keyed by its shape, is run eagerly
/// the first time (module loading, cuBLASLt heuristics), captured the second time, and replayed after that.
/// A graph is dropped when the device pointers it baked in change (signature). Outputs equal the eager path
/// bit for bit (the same kernels with the same arguments).
class DecodeGraphs {
 public:
  explicit DecodeGraphs(size_t max_graphs = 64) : max_graphs_(max_graphs) {}
  ~DecodeGraphs();
  DecodeGraphs(const DecodeGraphs&) = delete;
  DecodeGraphs& operator=(const DecodeGraphs&) = delete;
  /// Enqueues `body` (device work only: no allocation, no host synchronization) on `s` for step shape `key`
  /// whose baked-in device pointers hash to `signature`.
  void run(cudaStream_t s, uint64_t key, uint64_t signature, const std::function<void()>& body);
  int64_t replays() const { return replays_; }
  int64_t captures() const { return captures_; }

 private:
  struct Entry {
    cudaGraphExec_t exec = nullptr;
    uint64_t signature = 0;
    bool seen = false;
    bool failed = false;  // capture refused: eager for good
  };
  size_t max_graphs_;
  std::map<uint64_t, Entry> graphs_;
  int64_t replays_ = 0, captures_ = 0;
};

/// FNV-1a hash of a pointer list.
uint64_t pointer_signature(const std::vector<const void*>& ptrs);

}  // namespace ssmserve::cuda
