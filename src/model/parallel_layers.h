// Owns the parallel per-layer loop of the weight loaders (CPU and GPU runners): layers load concurrently, errors
// surface as the sequential loop would raise them.
#pragma once
#include <cstdint>
#include <exception>
#include <vector>

namespace ssmserve {

/// Calls fn(l) for every layer l in [0, num_layers) on the OpenMP threads (dynamic schedule). fn must only touch
/// layer l's own outputs; dummy weights are seeded per tensor name, so values do not depend on the order. If any
/// call throws, the exception of the lowest failing layer is rethrown after the loop (the error a sequential loop
/// would have raised first); the other layers' exceptions are dropped.
template <class Fn>
void for_each_layer_parallel(int64_t num_layers, Fn&& fn) {
  std::vector<std::exception_ptr> errors(static_cast<size_t>(num_layers > 0 ? num_layers : 0));
#pragma omp parallel for schedule(dynamic)
  for (int64_t l = 0; l < num_layers; ++l) {
    try {
      fn(l);
    } catch (...) {
      errors[static_cast<size_t>(l)] = std::current_exception();
    }
  }
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace ssmserve
