// Owns the decoder's per-sublayer GPU time profile (SSMSERVE_LAYER_PROFILE=1, docs/environment.md): where a step's
// time goes, per module kind, in eager mode. Each timed span is a pair of CUDA events on the runner's stream; a step
// ends with a stream synchronize (so the profile slows the run a little and turns CUDA graphs off), then the spans'
// elapsed times are added per (step kind, label). The rest of the step's GPU time (embedding, plans, the final
// norm, LM head, sampling) is "other"; the host wall time of the step call is reported next to it, so a host-bound
// step shows as wall >> GPU. Spans nest ("attention/gemm" is inside "attention"; times are inclusive). The table goes
// to stderr when the runner is destroyed.
#pragma once
#include <cuda_runtime_api.h>

#include <chrono>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace ssmserve::cuda {

class LayerProfile {
 public:
  LayerProfile() = default;
  LayerProfile(const LayerProfile&) = delete;
  LayerProfile& operator=(const LayerProfile&) = delete;
  ~LayerProfile();  ///< prints the table (stderr) and frees the events

  /// Starts a step of kind `kind` ("decode" / "prefill") on stream s.
  void begin_step(const char* kind, cudaStream_t s);
  /// Opens a span named `label` inside the innermost open one ("outer/label"); end() closes the innermost.
  void begin(const std::string& label, cudaStream_t s);
  void end(cudaStream_t s);
  /// Ends the step: synchronizes s and adds its spans, its GPU time and its host wall time.
  void end_step(cudaStream_t s);

 private:
  cudaEvent_t event(size_t i);
  struct Sum {
    double ms = 0;
    long long calls = 0;
  };
  struct Kind {
    long long steps = 0;
    double gpu_ms = 0, wall_ms = 0;
    std::map<std::string, Sum> spans;
  };
  struct Span {
    std::string label;
    size_t begin = 0, end = 0;  // event indices
  };
  std::vector<cudaEvent_t> events_;  // [0] step begin, [1] step end, then two per span
  std::vector<Span> spans_;          // this step's spans
  std::vector<size_t> open_;         // indices into spans_ of the open ones, innermost last
  size_t used_ = 2;
  std::string kind_;
  std::chrono::steady_clock::time_point wall0_;
  std::map<std::string, Kind> kinds_;
};

/// Times the enclosing scope as a span of `p` (nothing when p is null).
class ProfileSpan {
 public:
  ProfileSpan(LayerProfile* p, const char* label, cudaStream_t s) : p_(p), s_(s) {
    if (p_) p_->begin(label, s_);
  }
  ~ProfileSpan() {
    if (p_) p_->end(s_);
  }
  ProfileSpan(const ProfileSpan&) = delete;
  ProfileSpan& operator=(const ProfileSpan&) = delete;

 private:
  LayerProfile* p_;
  cudaStream_t s_;
};

}  // namespace ssmserve::cuda
