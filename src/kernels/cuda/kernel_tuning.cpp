// Owns the process's kernel-path switches (see kernel_tuning.h).
#include "kernels/cuda/kernel_tuning.h"

namespace ssmserve::cuda {
namespace {
KernelTuning& tuning() {
  static KernelTuning t;
  return t;
}
}  // namespace

const KernelTuning& kernel_tuning() { return tuning(); }
void set_kernel_tuning(const KernelTuning& t) { tuning() = t; }

}  // namespace ssmserve::cuda
