// Owns the end-to-end corrupt-checkpoint tests: the real `ssmserve generate` binary, pointed at a copy of
// models/tiny-mamba with one defect, must exit with status 1 (never a signal) and name the problem on stderr.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>

#include "checkpoint_fixtures.h"

namespace ssmserve {
namespace {

namespace fs = std::filesystem;
using ::ssmserve::testing::read_file;
using ::ssmserve::testing::SafetensorsImage;
using ::ssmserve::testing::TempDir;
using ::ssmserve::testing::write_file;
using ::testing::HasSubstr;
using ::testing::Not;

const fs::path kTinyMamba = fs::path(SSMSERVE_SOURCE_DIR) / "models/tiny-mamba";

/// How a child process ended and what it wrote to stderr.
struct RunResult {
  bool exited = false;  ///< true when it called exit (false: killed by a signal)
  int code = -1;        ///< exit status, or the signal number when !exited
  std::string err;
};

/// Runs `argv` (argv[0] = executable path) with stdout discarded and stderr captured; killed by SIGALRM after
/// `timeout_s` seconds.
RunResult run_process(const std::vector<std::string>& argv, const fs::path& err_path, unsigned timeout_s = 300) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const int err_fd = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int null_fd = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  if (err_fd < 0 || null_fd < 0) throw std::runtime_error("cannot open capture files");
  const pid_t pid = ::fork();
  if (pid == 0) {  // child: only async-signal-safe calls until exec
    ::dup2(null_fd, STDOUT_FILENO);
    ::dup2(err_fd, STDERR_FILENO);
    ::alarm(timeout_s);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  ::close(err_fd);
  ::close(null_fd);
  if (pid < 0) throw std::runtime_error("fork failed");
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) throw std::runtime_error("waitpid failed");
  }
  RunResult r;
  r.exited = WIFEXITED(status);
  r.code = r.exited ? WEXITSTATUS(status) : WTERMSIG(status);
  r.err = read_file(err_path);
  return r;
}

class CorruptCli : public ::testing::Test {
 protected:
  /// The real checkpoint, parsed once for every test.
  static const SafetensorsImage& original() {
    static const SafetensorsImage img = SafetensorsImage::load(kTinyMamba / "model.safetensors");
    return img;
  }

  /// A copy of tiny-mamba's config and tokenizer files in a temp dir, with `model` as model.safetensors.
  void make_model(const std::string& model_bytes) {
    for (const char* f : {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"})
      fs::copy_file(kTinyMamba / f, dir_ / f, fs::copy_options::overwrite_existing);
    write_file(dir_ / "model.safetensors", model_bytes);
  }

  /// make_model with the original data and a header edited by `edit`.
  void make_model_with_header(const std::function<void(nlohmann::json&)>& edit) {
    SafetensorsImage img = original();
    edit(img.header);
    make_model(img.serialize());
  }

  /// Runs `ssmserve generate` on the temp model folder.
  RunResult generate(const std::vector<std::string>& extra = {}) {
    const std::string bin = SSMSERVE_BINARY;
    if (!fs::exists(bin)) ADD_FAILURE() << "binary not built: " << bin;
    std::vector<std::string> argv = {bin, "generate", "--model", dir_.path().string(), "--prompt", "hi", "--max-tokens", "1"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return run_process(argv, scratch_ / "stderr.txt");
  }

  /// Asserts a clean failure: exit status exactly 1, no sanitizer report, stderr containing every `needles`.
  void expect_clean_failure(const std::vector<std::string>& needles) {
    const RunResult r = generate();
    EXPECT_TRUE(r.exited) << "killed by signal " << r.code << "; stderr:\n" << r.err;
    EXPECT_EQ(r.code, 1) << "stderr:\n" << r.err;
    EXPECT_THAT(r.err, Not(HasSubstr("Sanitizer")));
    EXPECT_THAT(r.err, Not(HasSubstr("runtime error:")));
    for (const auto& n : needles) EXPECT_THAT(r.err, HasSubstr(n));
  }

  /// make_model with the original weights, then `file` (in the model folder) replaced by a symlink to `target`.
  void make_model_with_symlink(const std::string& file, const fs::path& target) {
    make_model(read_file(kTinyMamba / "model.safetensors"));
    fs::remove_all(dir_ / file);
    fs::create_symlink(target, dir_ / file);
  }

  /// make_model with the original weights and `file` (a JSON file of tiny-mamba) edited by `edit`.
  void make_model_with_json(const std::string& file, const std::function<void(nlohmann::json&)>& edit) {
    make_model(read_file(kTinyMamba / "model.safetensors"));
    auto j = nlohmann::json::parse(read_file(kTinyMamba / file));
    edit(j);
    write_file(dir_ / file, j.dump());
  }

  TempDir dir_{"corrupt-model"};
  TempDir scratch_{"corrupt-out"};
};

TEST_F(CorruptCli, IntactCopyGenerates) {
  make_model(read_file(kTinyMamba / "model.safetensors"));
  const RunResult r = generate();
  EXPECT_TRUE(r.exited) << r.err;
  EXPECT_EQ(r.code, 0) << r.err;
}

TEST_F(CorruptCli, TruncatedFile) {
  const std::string full = original().serialize();
  make_model(full.substr(0, full.size() / 2));
  expect_clean_failure({"model.safetensors", "truncated"});
}

TEST_F(CorruptCli, TruncatedInsideHeader) {
  make_model(original().serialize().substr(0, 1000));
  expect_clean_failure({"model.safetensors", "header length"});
}

TEST_F(CorruptCli, BadHeaderLength) {
  make_model(original().serialize(uint64_t{1} << 40));
  expect_clean_failure({"model.safetensors", "header length"});
}

TEST_F(CorruptCli, NonJsonHeader) {
  const std::string h(64, '#');
  make_model(original().with_header_text(h, h.size()));
  expect_clean_failure({"model.safetensors", "not valid JSON"});
}

TEST_F(CorruptCli, OffsetsOutOfRange) {
  const uint64_t size = original().data.size();
  make_model_with_header([&](nlohmann::json& h) {
    h["backbone.norm_f.weight"]["data_offsets"] = {size - 256, size + 256};
  });
  expect_clean_failure({"model.safetensors", "backbone.norm_f.weight", "data_offsets"});
}

TEST_F(CorruptCli, OffsetsDisagreeWithShape) {
  make_model_with_header([](nlohmann::json& h) { h["backbone.layers.2.mixer.A_log"]["shape"] = {512, 17}; });
  expect_clean_failure({"model.safetensors", "backbone.layers.2.mixer.A_log"});
}

TEST_F(CorruptCli, WrongDtype) {
  // Same element size, so the header is consistent; the model must refuse the dtype when it reads the tensor.
  make_model_with_header([](nlohmann::json& h) { h["backbone.layers.0.mixer.D"]["dtype"] = "I16"; });
  expect_clean_failure({"model.safetensors", "backbone.layers.0.mixer.D", "I16"});
}

TEST_F(CorruptCli, WrongShape) {
  // Same element count as [1024, 256], so only the config-derived shape check can catch it.
  make_model_with_header([](nlohmann::json& h) { h["backbone.layers.3.mixer.in_proj.weight"]["shape"] = {512, 512}; });
  expect_clean_failure({"model.safetensors", "backbone.layers.3.mixer.in_proj.weight", "[512, 512]"});
}

TEST_F(CorruptCli, MissingTensor) {
  make_model_with_header([](nlohmann::json& h) { h.erase("backbone.layers.5.mixer.dt_proj.bias"); });
  expect_clean_failure({"backbone.layers.5.mixer.dt_proj.bias", "missing"});
}

TEST_F(CorruptCli, NanWeightIsNamed) {
  // A NaN inside a tensor: the checkpoint loads (as in transformers), a warning names the tensor, and the NaN logits
  // end the run with the sampler's error (exit status 1, no crash).
  SafetensorsImage img = original();
  const auto& entry = img.header.at("backbone.layers.5.mixer.x_proj.weight");
  ASSERT_EQ(entry.at("dtype"), "BF16");
  const size_t at = entry.at("data_offsets")[0].get<size_t>() + 2 * 700;  // element 700
  img.data[at] = static_cast<char>(0xc0), img.data[at + 1] = static_cast<char>(0x7f);  // bf16 NaN 0x7fc0, little-endian
  make_model(img.serialize());
  expect_clean_failure({"backbone.layers.5.mixer.x_proj.weight", "1 NaN / Inf value(s) (first at flat index 700)", "NaN"});
  // Tensor-parallel ranks each read the tensor: the warning still comes once.
  const RunResult tp = generate({"--tensor-parallel-size", "2"});
  EXPECT_EQ(tp.code, 1) << tp.err;
  const std::string needle = "tensor \"backbone.layers.5.mixer.x_proj.weight\" holds";
  size_t count = 0;
  for (size_t at = tp.err.find(needle); at != std::string::npos; at = tp.err.find(needle, at + 1)) ++count;
  EXPECT_EQ(count, 1u) << tp.err;
}

TEST_F(CorruptCli, UnusedCheckpointTensorsAreNamed) {
  // A config that describes less than the checkpoint holds (4 of its 8 layers; conv biases it says are absent)
  // loads as transformers does, with one warning naming the ignored tensors, instead of silently truncating.
  make_model(read_file(kTinyMamba / "model.safetensors"));
  const auto orig = nlohmann::json::parse(read_file(kTinyMamba / "config.json"));
  auto cfg = orig;
  cfg["num_hidden_layers"] = 4;
  write_file(dir_ / "config.json", cfg.dump(2));
  for (const std::vector<std::string>& extra : {std::vector<std::string>{}, std::vector<std::string>{"--tensor-parallel-size", "2"}}) {
    const RunResult r = generate(extra);
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_THAT(r.err, HasSubstr("checkpoint tensor(s) are not used by the model")) << r.err;
    EXPECT_THAT(r.err, HasSubstr("\"backbone.layers.4.mixer.A_log\"")) << r.err;
    EXPECT_EQ(r.err.find("not used by the model"), r.err.rfind("not used by the model")) << "warned once:\n" << r.err;
  }
  cfg = orig;
  cfg["use_conv_bias"] = false;
  write_file(dir_ / "config.json", cfg.dump(2));
  EXPECT_THAT(generate().err, HasSubstr("\"backbone.layers.0.mixer.conv1d.bias\""));
  write_file(dir_ / "config.json", orig.dump(2));  // the checkpoint as it is: no warning
  EXPECT_EQ(generate().err.find("not used by the model"), std::string::npos);
}

TEST_F(CorruptCli, InvalidJsonConfig) {
  make_model(read_file(kTinyMamba / "model.safetensors"));
  write_file(dir_ / "config.json", "{\"hidden_size\": 256,, \"num_hidden_layers\": 8}");
  expect_clean_failure({"config.json", "invalid JSON"});
}

TEST_F(CorruptCli, InvalidConfigField) {
  make_model(read_file(kTinyMamba / "model.safetensors"));
  auto cfg = nlohmann::json::parse(read_file(kTinyMamba / "config.json"));
  cfg["state_size"] = "abc";
  write_file(dir_ / "config.json", cfg.dump(2));
  expect_clean_failure({"config.json", "\"state_size\""});
}

// ---- Hostile files: huge token ids, non-regular files, size caps, deep JSON, unsupported config values ----

/// `n` nested arrays: "[[[...]]]".
std::string deep_arrays(size_t n) { return std::string(n, '[') + std::string(n, ']'); }

TEST_F(CorruptCli, HugeAddedTokenId) {
  make_model_with_json("tokenizer.json", [](nlohmann::json& t) {
    t["added_tokens"].push_back({{"id", 200000000}, {"content", "<huge>"}, {"special", true}, {"normalized", false},
                                 {"single_word", false}, {"lstrip", false}, {"rstrip", false}});
  });
  expect_clean_failure({"tokenizer.json", "<huge>", "200000000"});
}

TEST_F(CorruptCli, MaxIntVocabId) {
  make_model_with_json("tokenizer.json", [](nlohmann::json& t) { t["model"]["vocab"]["zzz"] = 2147483647; });
  expect_clean_failure({"tokenizer.json", "'zzz'", "2147483647"});
}

TEST_F(CorruptCli, TokenizerIsDevZero) {
  make_model_with_symlink("tokenizer.json", "/dev/zero");
  expect_clean_failure({"tokenizer.json", "character device", "not a regular file"});
}

TEST_F(CorruptCli, TokenizerIsDirectory) {
  make_model(read_file(kTinyMamba / "model.safetensors"));
  fs::remove(dir_ / "tokenizer.json");
  fs::create_directory(dir_ / "tokenizer.json");
  expect_clean_failure({"tokenizer.json", "is a directory"});
}

TEST_F(CorruptCli, TokenizerTooLarge) {
  make_model(read_file(kTinyMamba / "model.safetensors"));
  fs::resize_file(dir_ / "tokenizer.json", uint64_t{600} << 20);  // sparse: no disk used
  expect_clean_failure({"tokenizer.json", "byte limit"});
}

TEST_F(CorruptCli, ConfigIsDevZero) {
  make_model_with_symlink("config.json", "/dev/zero");
  expect_clean_failure({"config.json", "character device", "not a regular file"});
}

TEST_F(CorruptCli, ConfigIsDirectory) {
  make_model(read_file(kTinyMamba / "model.safetensors"));
  fs::remove(dir_ / "config.json");
  fs::create_directory(dir_ / "config.json");
  expect_clean_failure({"config.json", "is a directory"});
}

TEST_F(CorruptCli, ConfigSymlinkLoop) {
  make_model_with_symlink("config.json", dir_ / "loop.json");
  fs::create_symlink(dir_ / "config.json", dir_ / "loop.json");
  expect_clean_failure({"config.json", "symlink loop"});
}

TEST_F(CorruptCli, ConfigDanglingSymlink) {
  make_model_with_symlink("config.json", dir_ / "nowhere.json");
  expect_clean_failure({"config.json", "dangling symlink"});
}

TEST_F(CorruptCli, ConfigTooLarge) {
  make_model(read_file(kTinyMamba / "model.safetensors"));
  fs::resize_file(dir_ / "config.json", uint64_t{100} << 20);  // sparse
  expect_clean_failure({"config.json", "byte limit"});
}

TEST_F(CorruptCli, GenerationConfigIsFifo) {
  make_model(read_file(kTinyMamba / "model.safetensors"));
  fs::remove(dir_ / "generation_config.json");
  ASSERT_EQ(::mkfifo((dir_ / "generation_config.json").c_str(), 0644), 0);
  expect_clean_failure({"generation_config.json", "fifo"});
}

TEST_F(CorruptCli, SafetensorsIsFifo) {
  make_model(read_file(kTinyMamba / "model.safetensors"));
  fs::remove(dir_ / "model.safetensors");
  ASSERT_EQ(::mkfifo((dir_ / "model.safetensors").c_str(), 0644), 0);
  expect_clean_failure({"model.safetensors", "fifo"});
}

TEST_F(CorruptCli, IndexIsDevZero) {
  make_model_with_symlink("model.safetensors.index.json", "/dev/zero");
  expect_clean_failure({"model.safetensors.index.json", "not a regular file"});
}

TEST_F(CorruptCli, DeeplyNestedConfig) {
  make_model(read_file(kTinyMamba / "model.safetensors"));
  write_file(dir_ / "config.json", deep_arrays(100000));
  expect_clean_failure({"config.json", "levels deep"});
}

TEST_F(CorruptCli, DeeplyNestedGenerationConfig) {
  make_model(read_file(kTinyMamba / "model.safetensors"));
  write_file(dir_ / "generation_config.json", "{\"eos_token_id\": " + deep_arrays(100000) + "}");
  expect_clean_failure({"generation_config.json", "levels deep"});
}

TEST_F(CorruptCli, DeeplyNestedIndex) {
  make_model(read_file(kTinyMamba / "model.safetensors"));
  write_file(dir_ / "model.safetensors.index.json", "{\"weight_map\": " + deep_arrays(100000) + "}");
  expect_clean_failure({"model.safetensors.index.json", "levels deep"});
}

TEST_F(CorruptCli, DeeplyNestedTokenizer) {
  make_model(read_file(kTinyMamba / "model.safetensors"));
  write_file(dir_ / "tokenizer.json", "{\"model\": " + deep_arrays(100000) + "}");
  expect_clean_failure({"tokenizer.json", "levels deep"});
}

TEST_F(CorruptCli, DeeplyNestedSafetensorsHeader) {
  const std::string h = deep_arrays(100000);
  make_model(original().with_header_text(h, h.size()));
  expect_clean_failure({"model.safetensors", "levels deep"});
}

TEST_F(CorruptCli, HugeNonObjectSafetensorsHeaderIsQuotedShort) {
  std::string h = "[";
  for (int i = 0; i < 200000; ++i) h += "1,";
  h += "1]";
  make_model(original().with_header_text(h, h.size()));
  const RunResult r = generate();
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("must be a JSON object"));
  EXPECT_LT(r.err.size(), 1000u) << "the header must be quoted, not dumped";
}

TEST_F(CorruptCli, HiddenActNotSilu) {
  make_model_with_json("config.json", [](nlohmann::json& c) { c["hidden_act"] = "gelu"; });
  expect_clean_failure({"config.json", "\"hidden_act\"", "gelu", "silu"});
}

TEST_F(CorruptCli, EosOutsideVocab) {
  make_model_with_json("config.json", [](nlohmann::json& c) { c["eos_token_id"] = 50280; });
  expect_clean_failure({"config.json", "\"eos_token_id\"", "50280", "vocab"});
}

TEST_F(CorruptCli, BosOutsideVocab) {
  make_model_with_json("config.json", [](nlohmann::json& c) { c["bos_token_id"] = 1000000; });
  expect_clean_failure({"config.json", "\"bos_token_id\"", "1000000"});
}

TEST_F(CorruptCli, PadOutsideVocab) {
  make_model_with_json("config.json", [](nlohmann::json& c) { c["pad_token_id"] = 60000; });
  expect_clean_failure({"config.json", "\"pad_token_id\"", "60000"});
}

TEST_F(CorruptCli, GenerationConfigEosOutsideVocab) {
  make_model_with_json("generation_config.json", [](nlohmann::json& g) { g["eos_token_id"] = {0, 50280}; });
  expect_clean_failure({"generation_config.json", "\"eos_token_id\"", "50280"});
}

TEST_F(CorruptCli, EpsilonInfinityOrNaN) {
  for (const char* bad : {"Infinity", "NaN", "-Infinity"}) {
    SCOPED_TRACE(bad);
    make_model(read_file(kTinyMamba / "model.safetensors"));
    auto cfg = nlohmann::json::parse(read_file(kTinyMamba / "config.json"));
    cfg["layer_norm_epsilon"] = "@EPS@";
    std::string text = cfg.dump(2);
    text.replace(text.find("\"@EPS@\""), 7, bad);
    write_file(dir_ / "config.json", text);
    expect_clean_failure({"config.json", "\"layer_norm_epsilon\"", "finite", std::string("got ") + bad});
  }
}

}  // namespace
}  // namespace ssmserve
