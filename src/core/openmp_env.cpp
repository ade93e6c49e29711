// Owns the default OpenMP wait policy (openmp_env.h).
//
// Measured on the 2-vCPU development VM, mamba2-130m shape, batch-1 decode (docs/benchmarks.md): with the cores
// shared (load average ~15), libgomp's default spinning gave 0.7 tokens/s, OMP_WAIT_POLICY=passive 11.7 and a
// spin count of 1000 the same as passive within noise. Idle (load < 1), the short spin measured 38-44 tokens/s
// against 44-55 for libgomp's default, so the short spin is only chosen when the machine is already busy.
#include "core/openmp_env.h"

#include "core/env_options.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>

namespace ssmserve {
namespace {

// True when the 1-minute load average already covers every online CPU (or cannot be read: false).
bool cores_busy() {
  std::ifstream in("/proc/loadavg");
  double load1 = 0.0;
  if (!(in >> load1)) return false;
  const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  return cpus > 0 && load1 >= static_cast<double>(cpus);
}

}  // namespace

void apply_openmp_wait_defaults(char** argv) {
  if (!env_options().omp_defaults) return;
  if (!cores_busy()) return;
  // Marks the re-executed process so it cannot loop, whatever the exec did with the variables above.
  setenv("SSMSERVE_NO_OMP_DEFAULTS", "1", 1);
  setenv("GOMP_SPINCOUNT", kDefaultGompSpinCount, 1);
  execv("/proc/self/exe", argv);
  // exec failed (no /proc, seccomp...): keep running with the policy libgomp already read.
  unsetenv("GOMP_SPINCOUNT");
}

}  // namespace ssmserve
