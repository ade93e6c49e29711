// Owns the per-sublayer GPU time profile (see layer_profile.h).
#include "runtime/layer_profile.h"

#include <cstdio>

#include "device/cuda_check.h"

namespace ssmserve::cuda {

cudaEvent_t LayerProfile::event(size_t i) {
  while (events_.size() <= i) {
    cudaEvent_t e = nullptr;
    SSM_CUDA_CHECK(cudaEventCreate(&e));
    events_.push_back(e);
  }
  return events_[i];
}

void LayerProfile::begin_step(const char* kind, cudaStream_t s) {
  kind_ = kind;
  spans_.clear(), open_.clear();
  used_ = 2;
  wall0_ = std::chrono::steady_clock::now();
  SSM_CUDA_CHECK(cudaEventRecord(event(0), s));
}

void LayerProfile::begin(const std::string& label, cudaStream_t s) {
  Span sp{open_.empty() ? label : spans_[open_.back()].label + "/" + label, used_, 0};
  SSM_CUDA_CHECK(cudaEventRecord(event(used_++), s));
  open_.push_back(spans_.size());
  spans_.push_back(std::move(sp));
}

void LayerProfile::end(cudaStream_t s) {
  if (open_.empty()) return;
  spans_[open_.back()].end = used_;
  open_.pop_back();
  SSM_CUDA_CHECK(cudaEventRecord(event(used_++), s));
}

void LayerProfile::end_step(cudaStream_t s) {
  SSM_CUDA_CHECK(cudaEventRecord(event(1), s));
  SSM_CUDA_CHECK(cudaStreamSynchronize(s));
  Kind& k = kinds_[kind_];
  ++k.steps;
  k.wall_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - wall0_).count();
  float ms = 0;
  SSM_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[0], events_[1]));
  k.gpu_ms += ms;
  for (const Span& sp : spans_) {
    if (sp.end == 0) continue;  // left open
    SSM_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[sp.begin], events_[sp.end]));
    Sum& sum = k.spans[sp.label];
    sum.ms += ms;
    ++sum.calls;
  }
}

LayerProfile::~LayerProfile() {
  for (const auto& [name, k] : kinds_) {
    if (k.steps == 0) continue;
    const double n = static_cast<double>(k.steps);
    std::fprintf(stderr, "layer profile, %s steps: %lld, host wall %.3f ms/step, GPU %.3f ms/step\n", name.c_str(), k.steps,
                 k.wall_ms / n, k.gpu_ms / n);
    std::fprintf(stderr, "  %-24s %10s %7s %10s %10s\n", "span", "ms/step", "% GPU", "us/call", "calls/step");
    double spans = 0;  // the outermost spans' sum
    for (const auto& [label, s] : k.spans) {
      if (label.find('/') == std::string::npos) spans += s.ms;
      std::fprintf(stderr, "  %-24s %10.3f %6.1f%% %10.1f %10.1f\n", label.c_str(), s.ms / n, 100 * s.ms / k.gpu_ms,
                   1000 * s.ms / static_cast<double>(s.calls), static_cast<double>(s.calls) / n);
    }
    std::fprintf(stderr, "  %-24s %10.3f %6.1f%%\n", "other (embed, head, ...)", (k.gpu_ms - spans) / n, 100 * (k.gpu_ms - spans) / k.gpu_ms);
  }
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
}

}  // namespace ssmserve::cuda
