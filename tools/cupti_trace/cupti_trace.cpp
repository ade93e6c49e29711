// A kernel timeline of CUDA-graph replays without changing the program: a CUDA injection library (the driver loads
// it when CUDA_INJECTION64_PATH names it and calls InitializeInjection) that records every kernel's GPU start / end
// through CUPTI's activity API (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: graph nodes one by one, Programmatic Dependent
// Launch overlap visible as overlapping intervals) and, at exit, writes the kernels of the last CUPTI_TRACE_STEPS graph
// launches (default 4) to CUPTI_TRACE_OUT as CSV: corr, graph_id, node_id, start_ns, end_ns, grid, block, regs, name.
// One CSV row per kernel, the launches in order; tools/cupti_trace/analyze.py reads it. The device machine has no
// nsys (docs/benchmarks.md, session 49).
// Build: g++ -O2 -shared -fPIC -I$CUDA/include tools/cupti_trace/cupti_trace.cpp -L$CUDA/lib64 -lcupti -o libcupti_trace.so
#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

struct Rec {
  uint64_t start, end, node;
  uint32_t corr, graph, grid, block;
  uint16_t regs;
  const char* name;
};

std::mutex g_mu;
std::vector<Rec> g_recs;
std::unordered_map<const char*, std::string> g_names;  // CUPTI's name pointer -> a copy

constexpr size_t kBufBytes = 8u << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(aligned_alloc(8, kBufBytes));
  *size = kBufBytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* rec = nullptr;
  std::lock_guard<std::mutex> lk(g_mu);
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
    if (k->graphId == 0) continue;  // only graph replays (decode steps)
    const char* key = k->name;
    auto it = g_names.find(key);
    if (it == g_names.end()) it = g_names.emplace(key, key ? std::string(key) : std::string("?")).first;
    g_recs.push_back({k->start, k->end, k->graphNodeId, k->correlationId, k->graphId,
                      static_cast<uint32_t>(k->gridX * k->gridY * k->gridZ),
                      static_cast<uint32_t>(k->blockX * k->blockY * k->blockZ), k->registersPerThread,
                      it->second.c_str()});
  }
  free(buffer);
}

/// The demangled name without arguments or return type, templates kept short: "ns::kernel<1, true, ...>".
std::string short_name(const char* mangled) {
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string s = status == 0 && d ? d : mangled;
  free(d);
  for (const char* pre : {"(anonymous namespace)::", "ssmserve::cuda::detail::", "ssmserve::cuda::"}) {
    size_t p;
    while ((p = s.find(pre)) != std::string::npos) s.erase(p, strlen(pre));
  }
  int depth = 0;  // the parameter list: the first '(' outside the template arguments
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<') ++depth;
    else if (s[i] == '>') --depth;
    else if (s[i] == '(' && depth == 0) {
      s.resize(i);
      break;
    }
  }
  if (s.rfind("void ", 0) == 0) s = s.substr(5);
  std::replace(s.begin(), s.end(), ',', ';');
  return s;
}

void write_out() {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  const char* path = getenv("CUPTI_TRACE_OUT");
  if (!path) return;
  const int steps = getenv("CUPTI_TRACE_STEPS") ? atoi(getenv("CUPTI_TRACE_STEPS")) : 4;
  std::lock_guard<std::mutex> lk(g_mu);
  std::sort(g_recs.begin(), g_recs.end(), [](const Rec& a, const Rec& b) { return a.start < b.start; });
  std::vector<uint32_t> order;  // launches (correlation ids) in order of their first kernel
  std::set<uint32_t> seen;
  for (const Rec& r : g_recs)
    if (seen.insert(r.corr).second) order.push_back(r.corr);
  std::set<uint32_t> keep(order.end() - std::min<size_t>(order.size(), static_cast<size_t>(steps)), order.end());
  FILE* f = fopen(path, "w");
  if (!f) return;
  fprintf(f, "corr,graph_id,node_id,start_ns,end_ns,grid,block,regs,name\n");
  std::unordered_map<const char*, std::string> shorts;
  for (const Rec& r : g_recs) {
    if (!keep.count(r.corr)) continue;
    auto it = shorts.find(r.name);
    if (it == shorts.end()) it = shorts.emplace(r.name, short_name(r.name)).first;
    fprintf(f, "%u,%u,%llu,%llu,%llu,%u,%u,%u,%s\n", r.corr, r.graph, static_cast<unsigned long long>(r.node),
            static_cast<unsigned long long>(r.start), static_cast<unsigned long long>(r.end), r.grid, r.block, r.regs,
            it->second.c_str());
  }
  fprintf(stderr, "cupti_trace: %zu graph kernels recorded, %zu launches, last %zu written to %s\n", g_recs.size(),
          order.size(), keep.size(), path);
  fclose(f);
}

}  // namespace

extern "C" int InitializeInjection(void) {
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS) return 0;
  if (cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) return 0;
  atexit(write_out);
  return 1;
}
