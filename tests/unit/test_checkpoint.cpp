// Owns the unit tests of Checkpoint / safetensors parsing: valid single and sharded folders, the real tiny-mamba
// checkpoint, and every kind of corrupt file (each must fail with an Error naming the file and tensor).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <limits>

#include "checkpoint_fixtures.h"
#include "core/error.h"
#include "model/checkpoint.h"

namespace ssmserve {
namespace {

using ::ssmserve::testing::bf16_tensor;
using ::ssmserve::testing::f16_tensor;
using ::ssmserve::testing::f32_tensor;
using ::ssmserve::testing::FixtureTensor;
using ::ssmserve::testing::SafetensorsImage;
using ::ssmserve::testing::TempDir;
using ::ssmserve::testing::write_file;
using ::ssmserve::testing::write_safetensors;
using ::testing::HasSubstr;

/// Runs Checkpoint::open(dir) (and `then` on the result) expecting an Error; returns its message.
template <typename F>
std::string open_error(const std::filesystem::path& dir, F then) {
  try {
    Checkpoint ck = Checkpoint::open(dir);
    then(ck);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected ssmserve::Error for " << dir;
  return {};
}
std::string open_error(const std::filesystem::path& dir) {
  return open_error(dir, [](Checkpoint&) {});
}

/// Three small tensors of different dtypes.
std::vector<FixtureTensor> small_tensors() {
  return {f32_tensor("a.f32", {2, 3}, {1, 2, 3, 4, 5, 6}), bf16_tensor("b.bf16", {4}, {0.5f, -1.0f, 2.0f, 3.0f}),
          f16_tensor("c.f16", {1, 2}, {0x3c00, 0xc000})};  // 1.0, -2.0
}

std::vector<float> as_f32(const TensorRef& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  to_f32(t.dtype, t.data, out.data(), out.size());
  return out;
}

TEST(CheckpointValid, SingleFileF32Bf16F16) {
  TempDir dir("ckpt");
  write_safetensors(dir / "model.safetensors", small_tensors());
  const Checkpoint ck = Checkpoint::open(dir.path());
  EXPECT_EQ(ck.names(), (std::vector<std::string>{"a.f32", "b.bf16", "c.f16"}));
  EXPECT_TRUE(ck.has("b.bf16"));
  EXPECT_FALSE(ck.has("nope"));

  const TensorRef& a = ck.get("a.f32", {2, 3});
  EXPECT_EQ(a.dtype, DType::F32);
  EXPECT_EQ(a.nbytes, 24u);
  EXPECT_EQ(a.numel(), 6);
  EXPECT_THAT(a.file, HasSubstr("model.safetensors"));
  EXPECT_EQ(as_f32(a), (std::vector<float>{1, 2, 3, 4, 5, 6}));

  const TensorRef& b = ck.get("b.bf16", {4});
  EXPECT_EQ(b.dtype, DType::BF16);
  EXPECT_EQ(as_f32(b), (std::vector<float>{0.5f, -1.0f, 2.0f, 3.0f}));

  const TensorRef& c = ck.get("c.f16", {1, 2});
  EXPECT_EQ(c.dtype, DType::F16);
  EXPECT_EQ(as_f32(c), (std::vector<float>{1.0f, -2.0f}));
}

TEST(CheckpointValid, ScalarAndEmptyTensorsAndMoves) {
  TempDir dir("ckpt");
  write_safetensors(dir / "model.safetensors",
                    {f32_tensor("scalar", {}, {7.0f}), f32_tensor("empty", {0, 4}, {}), f32_tensor("x", {1}, {3})});
  Checkpoint moved = Checkpoint::open(dir.path());
  const Checkpoint ck = std::move(moved);
  EXPECT_EQ(as_f32(ck.get("scalar", {})), std::vector<float>{7.0f});
  EXPECT_EQ(ck.get("empty", {0, 4}).nbytes, 0u);
  EXPECT_EQ(as_f32(ck.get("x", {1})), std::vector<float>{3.0f});
}

TEST(CheckpointValid, MisalignedDataIsServedAligned) {
  TempDir dir("ckpt");
  const auto img = SafetensorsImage::build({f32_tensor("w", {3}, {1.5f, 2.5f, 3.5f})});
  std::string h = img.header.dump();
  if (h.size() % 2 == 0) h += ' ';  // odd header length: the data section starts at an odd address
  write_file(dir / "model.safetensors", img.with_header_text(h, h.size()));
  const Checkpoint ck = Checkpoint::open(dir.path());
  const TensorRef& w = ck.get("w", {3});
  EXPECT_EQ(reinterpret_cast<uintptr_t>(w.data) % 4, 0u);
  EXPECT_EQ(as_f32(w), (std::vector<float>{1.5f, 2.5f, 3.5f}));
}

TEST(CheckpointValid, ShardedWithIndex) {
  TempDir dir("ckpt");
  write_safetensors(dir / "model-00001-of-00002.safetensors", {f32_tensor("l0.w", {2}, {1, 2})});
  write_safetensors(dir / "model-00002-of-00002.safetensors",
                    {bf16_tensor("l1.w", {2}, {3, 4}), bf16_tensor("norm", {1}, {5})});
  write_file(dir / "model.safetensors.index.json",
             R"({"metadata": {"total_size": 10}, "weight_map": {"l0.w": "model-00001-of-00002.safetensors",
                 "l1.w": "model-00002-of-00002.safetensors", "norm": "model-00002-of-00002.safetensors"}})");
  const Checkpoint ck = Checkpoint::open(dir.path());
  EXPECT_EQ(ck.names(), (std::vector<std::string>{"l0.w", "l1.w", "norm"}));
  EXPECT_THAT(ck.get("l0.w", {2}).file, HasSubstr("model-00001-of-00002.safetensors"));
  EXPECT_THAT(ck.get("l1.w", {2}).file, HasSubstr("model-00002-of-00002.safetensors"));
  EXPECT_EQ(as_f32(ck.get("norm", {1})), std::vector<float>{5});
}

TEST(CheckpointValid, GlobsShardsWithoutIndex) {
  TempDir dir("ckpt");
  write_safetensors(dir / "b.safetensors", {f32_tensor("y", {1}, {2})});
  write_safetensors(dir / "a.safetensors", {f32_tensor("x", {1}, {1})});
  write_file(dir / "README.md", "not a checkpoint");
  const Checkpoint ck = Checkpoint::open(dir.path());
  EXPECT_EQ(ck.names(), (std::vector<std::string>{"x", "y"}));
}

TEST(CheckpointValid, RealTinyMamba) {
  const Checkpoint ck = Checkpoint::open(std::filesystem::path(SSMSERVE_SOURCE_DIR) / "models/tiny-mamba");
  const auto names = ck.names();
  EXPECT_EQ(names.size(), 82u);  // 83 header keys minus "__metadata__": embeddings + 8 x 10 + norm_f
  for (const auto& n : names) {
    EXPECT_TRUE(ck.has(n));
  }
  const TensorRef& in_proj = ck.get("backbone.layers.0.mixer.in_proj.weight", {1024, 256});
  EXPECT_EQ(in_proj.dtype, DType::BF16);
  EXPECT_EQ(in_proj.nbytes, 1024u * 256u * 2u);
  EXPECT_EQ(ck.get("backbone.embeddings.weight", {50280, 256}).dtype, DType::BF16);
  EXPECT_EQ(ck.get("backbone.layers.7.mixer.conv1d.weight", {512, 1, 4}).dtype, DType::BF16);
  EXPECT_EQ(ck.get("backbone.norm_f.weight", {256}).dtype, DType::BF16);
  EXPECT_FALSE(ck.has("lm_head.weight"));  // tied embeddings
  const auto norm = as_f32(ck.get("backbone.norm_f.weight", {256}));
  for (const float v : norm) EXPECT_TRUE(std::isfinite(v));
}

// ---- folder-level errors -------------------------------------------------------------------------------------

TEST(CheckpointErrors, MissingOrEmptyFolder) {
  TempDir dir("ckpt");
  EXPECT_THAT(open_error(dir / "absent"), HasSubstr("absent"));
  EXPECT_THAT(open_error(dir.path()), HasSubstr("no model.safetensors"));
}

TEST(CheckpointErrors, DuplicateTensorAcrossShards) {
  TempDir dir("ckpt");
  write_safetensors(dir / "a.safetensors", {f32_tensor("x", {1}, {1})});
  write_safetensors(dir / "b.safetensors", {f32_tensor("x", {1}, {2})});
  const std::string msg = open_error(dir.path());
  EXPECT_THAT(msg, HasSubstr("\"x\""));
  EXPECT_THAT(msg, HasSubstr("a.safetensors"));
  EXPECT_THAT(msg, HasSubstr("b.safetensors"));
}

TEST(CheckpointErrors, IndexProblems) {
  TempDir dir("ckpt");
  write_safetensors(dir / "s1.safetensors", {f32_tensor("x", {1}, {1})});
  write_file(dir / "model.safetensors.index.json", R"({"weight_map": {"x": "s1.safetensors", "y": "s2.safetensors"}})");
  std::string msg = open_error(dir.path());
  EXPECT_THAT(msg, HasSubstr("model.safetensors.index.json"));
  EXPECT_THAT(msg, HasSubstr("s2.safetensors"));

  write_file(dir / "model.safetensors.index.json", R"({"weight_map": {"x": "s1.safetensors", "y": "s1.safetensors"}})");
  msg = open_error(dir.path());
  EXPECT_THAT(msg, HasSubstr("\"y\""));
  EXPECT_THAT(msg, HasSubstr("no shard holds it"));

  write_file(dir / "model.safetensors.index.json", R"({"weight_map": {"x": "../s1.safetensors"}})");
  EXPECT_THAT(open_error(dir.path()), HasSubstr("not a file inside the folder"));

  write_file(dir / "model.safetensors.index.json", R"({"weight_map": {"x": "s1.safetensors",}})");
  msg = open_error(dir.path());
  EXPECT_THAT(msg, HasSubstr("model.safetensors.index.json"));
  EXPECT_THAT(msg, HasSubstr("invalid JSON"));
}

// ---- corrupt files -------------------------------------------------------------------------------------------

/// A folder with one model.safetensors holding `bytes`; returns the open() error.
std::string error_for_bytes(const std::string& bytes) {
  TempDir dir("ckpt");
  write_file(dir / "model.safetensors", bytes);
  const std::string msg = open_error(dir.path());
  EXPECT_THAT(msg, HasSubstr("model.safetensors"));
  return msg;
}

/// The error for small_tensors() after `edit` changes the header.
template <typename F>
std::string error_for_header_edit(F edit) {
  auto img = SafetensorsImage::build(small_tensors());
  edit(img.header);
  return error_for_bytes(img.serialize());
}

TEST(CheckpointCorrupt, TruncatedInsideData) {
  const std::string full = SafetensorsImage::build(small_tensors()).serialize();
  const std::string msg = error_for_bytes(full.substr(0, full.size() - 3));
  EXPECT_THAT(msg, HasSubstr("\"c.f16\""));
  EXPECT_THAT(msg, HasSubstr("truncated"));
}

TEST(CheckpointCorrupt, TruncatedInsideHeader) {
  const auto img = SafetensorsImage::build(small_tensors());
  const std::string full = img.serialize();
  const std::string msg = error_for_bytes(full.substr(0, 8 + img.header_text().size() / 2));
  EXPECT_THAT(msg, HasSubstr("header length"));
  EXPECT_THAT(error_for_bytes(full.substr(0, 5)), HasSubstr("too short"));
  EXPECT_THAT(error_for_bytes(""), HasSubstr("too short"));
}

TEST(CheckpointCorrupt, HeaderLengthLargerThanFile) {
  const auto img = SafetensorsImage::build(small_tensors());
  EXPECT_THAT(error_for_bytes(img.serialize(img.header_text().size() + img.data.size() + 1)),
              HasSubstr("exceeds"));
  EXPECT_THAT(error_for_bytes(img.serialize(std::numeric_limits<uint64_t>::max())), HasSubstr("exceeds"));
  EXPECT_THAT(error_for_bytes(img.serialize(uint64_t{1} << 63)), HasSubstr("header length"));
}

TEST(CheckpointCorrupt, HeaderLengthZeroOrNonJson) {
  const auto img = SafetensorsImage::build(small_tensors());
  EXPECT_THAT(error_for_bytes(img.serialize(0)), HasSubstr("header length is 0"));
  EXPECT_THAT(error_for_bytes(img.with_header_text("this is not json", 16)), HasSubstr("not valid JSON"));
  EXPECT_THAT(error_for_bytes(img.with_header_text("[1, 2, 3]       ", 16)), HasSubstr("must be a JSON object"));
  EXPECT_THAT(error_for_bytes(img.with_header_text(std::string(16, '\0'), 16)), HasSubstr("not valid JSON"));
  // Header bytes are fine, but the length prefix cuts them short.
  EXPECT_THAT(error_for_bytes(img.serialize(img.header_text().size() - 5)), HasSubstr("not valid JSON"));
}

TEST(CheckpointCorrupt, DuplicateKeyInHeader) {
  const auto img = SafetensorsImage::build({});
  const std::string h = R"({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
                        R"( "x": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})";
  SafetensorsImage two = img;
  two.data = std::string(8, '\0');
  const std::string msg = error_for_bytes(two.with_header_text(h, h.size()));
  EXPECT_THAT(msg, HasSubstr("\"x\" appears twice"));
}

TEST(CheckpointCorrupt, OffsetsOutOfRange) {
  std::string msg = error_for_header_edit([](auto& h) { h["b.bf16"]["data_offsets"] = {24, 10'000}; });
  EXPECT_THAT(msg, HasSubstr("\"b.bf16\""));
  EXPECT_THAT(msg, HasSubstr("10000"));
  msg = error_for_header_edit([](auto& h) { h["a.f32"]["data_offsets"] = {24, 0}; });
  EXPECT_THAT(msg, HasSubstr("\"a.f32\""));
  EXPECT_THAT(msg, HasSubstr("end before begin"));
  msg = error_for_header_edit([](auto& h) { h["a.f32"]["data_offsets"] = {-4, 20}; });
  EXPECT_THAT(msg, HasSubstr("\"a.f32\""));
  msg = error_for_header_edit([](auto& h) { h["a.f32"]["data_offsets"] = {0}; });
  EXPECT_THAT(msg, HasSubstr("\"a.f32\""));
  msg = error_for_header_edit([](auto& h) { h["a.f32"]["data_offsets"] = {"0", "24"}; });
  EXPECT_THAT(msg, HasSubstr("\"a.f32\""));
  msg = error_for_header_edit([](auto& h) { h["a.f32"]["data_offsets"] = {0.0, 24.5}; });
  EXPECT_THAT(msg, HasSubstr("\"a.f32\""));
}

TEST(CheckpointCorrupt, OffsetsDisagreeWithShapeTimesDtype) {
  std::string msg = error_for_header_edit([](auto& h) { h["a.f32"]["shape"] = {2, 2}; });
  EXPECT_THAT(msg, HasSubstr("\"a.f32\""));
  EXPECT_THAT(msg, HasSubstr("needs 16 bytes"));
  msg = error_for_header_edit([](auto& h) { h["a.f32"]["dtype"] = "F64"; });  // 6 x 8 != 24
  EXPECT_THAT(msg, HasSubstr("\"a.f32\""));
  EXPECT_THAT(msg, HasSubstr("F64"));
}

TEST(CheckpointCorrupt, OverlappingOffsets) {
  const std::string msg = error_for_header_edit([](auto& h) {
    h["b.bf16"]["data_offsets"] = {20, 28};  // a.f32 is [0, 24]
  });
  EXPECT_THAT(msg, HasSubstr("overlapping"));
  EXPECT_THAT(msg, HasSubstr("\"a.f32\""));
  EXPECT_THAT(msg, HasSubstr("\"b.bf16\""));
  EXPECT_THAT(error_for_header_edit([](auto& h) { h["c.f16"]["data_offsets"] = {24, 28}; }),
              HasSubstr("overlapping"));
}

TEST(CheckpointCorrupt, NegativeOrOverflowingShape) {
  std::string msg = error_for_header_edit([](auto& h) { h["a.f32"]["shape"] = {-2, -3}; });
  EXPECT_THAT(msg, HasSubstr("\"a.f32\""));
  EXPECT_THAT(msg, HasSubstr("shape"));
  msg = error_for_header_edit([](auto& h) { h["a.f32"]["shape"] = {uint64_t{1} << 31, uint64_t{1} << 31, 4}; });
  EXPECT_THAT(msg, HasSubstr("\"a.f32\""));
  EXPECT_THAT(msg, HasSubstr("64 bits"));
  msg = error_for_header_edit([](auto& h) { h["a.f32"]["shape"] = {uint64_t{1} << 61, 2}; });  // x 4 bytes
  EXPECT_THAT(msg, HasSubstr("\"a.f32\""));
  EXPECT_THAT(msg, HasSubstr("overflows"));
  msg = error_for_header_edit([](auto& h) { h["a.f32"]["shape"] = {std::numeric_limits<uint64_t>::max()}; });
  EXPECT_THAT(msg, HasSubstr("\"a.f32\""));
  msg = error_for_header_edit([](auto& h) { h["a.f32"]["shape"] = {1e30}; });
  EXPECT_THAT(msg, HasSubstr("\"a.f32\""));
  msg = error_for_header_edit([](auto& h) { h["a.f32"]["shape"] = 6; });
  EXPECT_THAT(msg, HasSubstr("\"a.f32\""));
}

TEST(CheckpointCorrupt, MissingOrBadFields) {
  EXPECT_THAT(error_for_header_edit([](auto& h) { h["a.f32"].erase("dtype"); }), HasSubstr("\"dtype\""));
  EXPECT_THAT(error_for_header_edit([](auto& h) { h["a.f32"]["dtype"] = 3; }), HasSubstr("\"dtype\""));
  EXPECT_THAT(error_for_header_edit([](auto& h) { h["a.f32"].erase("shape"); }), HasSubstr("\"shape\""));
  EXPECT_THAT(error_for_header_edit([](auto& h) { h["a.f32"].erase("data_offsets"); }), HasSubstr("data_offsets"));
  EXPECT_THAT(error_for_header_edit([](auto& h) { h["a.f32"] = "F32"; }), HasSubstr("\"a.f32\""));
}

// ---- errors on get() ------------------------------------------------------------------------------------------

TEST(CheckpointGet, WrongShapeRequested) {
  TempDir dir("ckpt");
  write_safetensors(dir / "model.safetensors", small_tensors());
  const Checkpoint ck = Checkpoint::open(dir.path());
  std::string msg;
  try {
    ck.get("a.f32", {3, 2});
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_THAT(msg, HasSubstr("model.safetensors"));
  EXPECT_THAT(msg, HasSubstr("\"a.f32\""));
  EXPECT_THAT(msg, HasSubstr("[2, 3]"));
  EXPECT_THAT(msg, HasSubstr("[3, 2]"));
  EXPECT_THROW(ck.get("a.f32", {6}), Error);
  EXPECT_THROW(ck.get("a.f32", {2, 3, 1}), Error);
}

TEST(CheckpointGet, MissingTensor) {
  TempDir dir("ckpt");
  write_safetensors(dir / "model.safetensors", small_tensors());
  const Checkpoint ck = Checkpoint::open(dir.path());
  std::string msg;
  try {
    ck.get("lm_head.weight", {4, 4});
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_THAT(msg, HasSubstr("\"lm_head.weight\""));
  EXPECT_THAT(msg, HasSubstr("missing"));
  EXPECT_THAT(msg, HasSubstr("model.safetensors"));
}

TEST(CheckpointGet, UnsupportedDtypeOnlyFailsWhenRequested) {
  TempDir dir("ckpt");
  std::vector<FixtureTensor> ts = small_tensors();
  ts.push_back(::ssmserve::testing::zeros_tensor("steps", "I64", {2}, 8));
  ts.push_back(::ssmserve::testing::zeros_tensor("mask", "BOOL", {3}, 1));
  ts.push_back({"weird", "Q4_K", {5}, std::string(3, '\0')});  // unknown dtype: size cannot be checked
  write_safetensors(dir / "model.safetensors", ts);
  const Checkpoint ck = Checkpoint::open(dir.path());
  EXPECT_TRUE(ck.has("steps"));
  EXPECT_EQ(ck.names().size(), 6u);
  EXPECT_EQ(ck.get("a.f32", {2, 3}).dtype, DType::F32);
  for (const auto& [name, dtype] : std::vector<std::pair<std::string, std::string>>{
           {"steps", "I64"}, {"mask", "BOOL"}, {"weird", "Q4_K"}}) {
    std::string msg;
    try {
      ck.get(name, {2});
    } catch (const Error& e) {
      msg = e.what();
    }
    EXPECT_THAT(msg, HasSubstr("model.safetensors"));
    EXPECT_THAT(msg, HasSubstr("\"" + name + "\""));
    EXPECT_THAT(msg, HasSubstr(dtype));
  }
}

}  // namespace
}  // namespace ssmserve
