// Tests respell_engine_options (engine/engine_options.h): engine error messages name options by their CLI flags and
// a front end respells them (the Python package: as LLM(...) keywords) — whole flags only, quoted text kept.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/engine_config.h"
#include "engine/engine_options.h"

namespace ssmserve {
namespace {

/// The Python package's spelling: the keyword, "=False" for a negated flag.
std::string as_keywords(std::string_view msg) {
  return respell_engine_options(msg, [](const EngineOptionName& o) {
    return std::string(o.name) + (o.negated ? "=False" : "");
  });
}

TEST(EngineOptions, FlagsBecomeKeywords) {
  EXPECT_EQ(as_keywords("--mamba-block-size 3 must be a multiple of 8 tokens"), "mamba_block_size 3 must be a multiple of 8 tokens");
  EXPECT_EQ(as_keywords("--num-state-blocks must be 0 (= --max-num-seqs + 1), got 1"),
            "num_state_blocks must be 0 (= max_num_seqs + 1), got 1");
  EXPECT_EQ(as_keywords("raise --num-state-blocks, or pass --no-enable-prefix-caching)"),
            "raise num_state_blocks, or pass enable_prefix_caching=False)");
  EXPECT_EQ(as_keywords("--speculative-config: method"), "speculative_config: method");
  EXPECT_EQ(as_keywords("--device"), "device");
  // The generation config's errors and hint (engine/generation_defaults.cpp) read as Python keywords.
  EXPECT_EQ(as_keywords("--override-generation-config: field \"top_p\" must be a number in (0, 1] (got 2)"),
            "override_generation_config: field \"top_p\" must be a number in (0, 1] (got 2)");
  EXPECT_EQ(as_keywords("(fix the file, or ignore it with --generation-config=\"vllm\")"),
            "(fix the file, or ignore it with generation_config=\"vllm\")");
}

TEST(EngineOptions, OnlyWholeKnownFlagsOutsideQuotes) {
  // A longer flag that starts like an engine flag, an unknown flag, and a dash run inside a word stay as they are.
  EXPECT_EQ(as_keywords("--max-num-seqs-per-request and --port and x--threads"), "--max-num-seqs-per-request and --port and x--threads");
  // A quoted command line or value keeps its text; the text after the quote is respelt again.
  EXPECT_EQ(as_keywords("only `ssmserve bench latency --speculative-config ...` runs it; see --swap-space"),
            "only `ssmserve bench latency --speculative-config ...` runs it; see swap_space");
  EXPECT_EQ(as_keywords("--mamba-cache-mode must be none, align or all (got \"--device\")"),
            "mamba_cache_mode must be none, align or all (got \"--device\")");
  EXPECT_EQ(as_keywords(""), "");
  EXPECT_EQ(as_keywords("--"), "--");
  EXPECT_EQ(as_keywords("unterminated \"--threads"), "unterminated \"--threads");
}

TEST(EngineOptions, EveryValidateMessageIsRespelt) {
  // Each knob's validate() error names its flag, which the table respells (no "--" left for the Python API).
  auto message = [](EngineConfig c) {
    try {
      c.validate();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  std::vector<EngineConfig> bad(13);
  bad[0].scheduler.max_num_batched_tokens = 0;
  bad[1].scheduler.max_num_seqs = 0;
  bad[2].num_state_blocks = 1;
  bad[3].num_threads = -1;
  bad[4].tensor_parallel_size = 0;
  bad[5].gpu_memory_utilization = 2;
  bad[6].max_model_len = -1;
  bad[7].num_scheduler_steps = 0;
  bad[8].mamba_cache_mode = "x";
  bad[9].swap_space = -1;
  bad[10].mamba_block_size = -1;
  bad[11].dtype = "half";
  bad[12].dtype = "bf16";
  for (const EngineConfig& c : bad) {
    const std::string msg = message(c);
    ASSERT_FALSE(msg.empty());
    EXPECT_EQ(msg.rfind("--", 0), 0u) << msg;  // the CLI's spelling
    EXPECT_EQ(as_keywords(msg).find("--"), std::string::npos) << msg << " -> " << as_keywords(msg);
  }
}

// vLLM's --dtype names: auto (nullopt: the backend's default), bfloat16, float32 and vLLM's alias float; vLLM's half /
// float16 (no fp16 kernels) and names vLLM does not take (bf16, fp32, other case) are errors naming --dtype and the
// accepted values, which EngineConfig::validate raises too.
TEST(EngineOptions, ModelDtype) {
  EXPECT_EQ(parse_model_dtype("auto"), std::nullopt);
  EXPECT_EQ(parse_model_dtype("bfloat16"), DType::BF16);
  EXPECT_EQ(parse_model_dtype("float32"), DType::F32);
  EXPECT_EQ(parse_model_dtype("float"), DType::F32);
  auto message = [](std::string_view d) {
    try {
      (void)parse_model_dtype(d);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  for (const char* d : {"half", "float16"})
    EXPECT_EQ(message(d), std::string("--dtype ") + d +
                              ": fp16 weights are not supported (the kernels run bf16 or fp32 weights); use one of: auto, "
                              "bfloat16, float32, float");
  for (const char* d : {"bf16", "fp32", "Float32", "", "float64"})
    EXPECT_EQ(message(d), std::string("--dtype must be one of: auto, bfloat16, float32, float (got \"") + d + "\")");
  EngineConfig c;
  EXPECT_EQ(c.dtype, "auto");
  for (const char* d : {"auto", "bfloat16", "float32", "float"}) {
    c.dtype = d;
    EXPECT_NO_THROW(c.validate()) << d;
  }
  c.dtype = "float16";
  EXPECT_THROW(c.validate(), Error);
  EXPECT_EQ(as_keywords(message("bf16")), "dtype must be one of: auto, bfloat16, float32, float (got \"bf16\")");
}

TEST(EngineOptions, TableHasOneFlagPerEntry) {
  std::set<std::string_view> flags;
  for (const EngineOptionName& o : kEngineOptionNames) {
    EXPECT_TRUE(flags.insert(o.flag).second) << o.flag;
    EXPECT_EQ(o.flag.rfind("--", 0), 0u) << o.flag;
    EXPECT_EQ(o.name.find('-'), std::string_view::npos) << o.name;
  }
}

}  // namespace
}  // namespace ssmserve
