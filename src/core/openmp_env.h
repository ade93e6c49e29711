// Owns the default OpenMP wait policy of the ssmserve process (see openmp_env.cpp for the measurements).
#pragma once

namespace ssmserve {

/// The spin count ssmserve gives libgomp when the user set neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT and the
/// cores are already busy at start-up (1-minute load average >= online CPUs): idle threads spin ~50 us and then
/// sleep, instead of libgomp's default of ~300,000 spins (milliseconds), which starves the working thread when
/// the cores are shared with other processes. On idle cores libgomp's default stays: there the long spin is
/// ~20% faster for decode (the serial gaps between a step's parallel regions outlast a short spin).
inline constexpr const char* kDefaultGompSpinCount = "1000";

/// Applies kDefaultGompSpinCount to this process when the cores are busy (see above). libgomp reads its environment once, when it is loaded (before
/// main), so when the variable has to be set this re-executes /proc/self/exe with the same argv (argv must be
/// main's, null-terminated). Does nothing when OMP_WAIT_POLICY, GOMP_SPINCOUNT or SSMSERVE_NO_OMP_DEFAULTS is
/// set, or after the re-exec. Never fails: if exec is impossible the process continues with libgomp's default.
void apply_openmp_wait_defaults(char** argv);

}  // namespace ssmserve
