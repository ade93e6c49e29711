// Owns the statistics the bench commands report over their repeats and requests (numpy's definitions, as vLLM's
// benchmarks compute them).
#pragma once
#include <utility>
#include <vector>

namespace ssmserve::cli {

/// The p-th percentile (p in [0, 100]) of v with linear interpolation (numpy's default); 0 for an empty v.
double percentile(std::vector<double> v, double p);

/// percentile(v, 50): the middle value, or the mean of the two middle ones; 0 for an empty v.
inline double median(std::vector<double> v) { return percentile(std::move(v), 50.0); }

}  // namespace ssmserve::cli
