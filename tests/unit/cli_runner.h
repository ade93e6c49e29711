// Owns the helper the CLI tests use to run the built `ssmserve` binary and capture what it prints.
#pragma once
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

#include "checkpoint_fixtures.h"

namespace ssmserve::testing {

/// What one run of the binary gave: exit code (or -signal), stdout and stderr.
struct CliRun {
  int status = -1;
  std::string out, err;
};

/// Runs `SSMSERVE_BINARY args` through the shell; captures stdout, stderr and the exit status.
inline CliRun run_cli(const std::string& args) {
  TempDir tmp("cli");
  const std::string cmd = std::string(SSMSERVE_BINARY) + " " + args + " 2>" + (tmp / "err").string();
  CliRun r;
  FILE* p = popen(cmd.c_str(), "r");
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
  r.err = read_file(tmp / "err");
  return r;
}

}  // namespace ssmserve::testing
