// Owns the libsentencepiece calls behind SentencePieceModel (see sentencepiece_model.h).
#include "tokenizer/sentencepiece_model.h"

#include <sentencepiece_processor.h>

#include "core/error.h"

namespace ssmserve {

struct SentencePieceModel::Impl {
  sentencepiece::SentencePieceProcessor sp;
};

SentencePieceModel::SentencePieceModel(const std::string& serialized, const std::string& source)
    : impl_(std::make_unique<Impl>()) {
  const auto status = impl_->sp.LoadFromSerializedProto(serialized);
  SSM_CHECK(status.ok(), "{}: not a valid SentencePiece model: {}", source, status.ToString());
  SSM_CHECK(impl_->sp.GetPieceSize() > 0, "{}: SentencePiece model has no pieces", source);
}

SentencePieceModel::~SentencePieceModel() = default;

std::vector<int> SentencePieceModel::encode(std::string_view text) const {
  std::vector<int> ids;
  const auto status = impl_->sp.Encode(std::string(text), &ids);
  SSM_CHECK(status.ok(), "SentencePiece encode failed: {}", status.ToString());
  return ids;
}

std::string SentencePieceModel::decode(std::span<const int> ids) const {
  std::string out;
  const auto status = impl_->sp.Decode(std::vector<int>(ids.begin(), ids.end()), &out);
  SSM_CHECK(status.ok(), "SentencePiece decode failed: {}", status.ToString());
  return out;
}

int SentencePieceModel::size() const { return impl_->sp.GetPieceSize(); }

std::string SentencePieceModel::piece(int id) const { return impl_->sp.IdToPiece(id); }

int SentencePieceModel::piece_to_id(std::string_view piece) const {
  const int id = impl_->sp.PieceToId(std::string(piece));
  // PieceToId answers unk_id for unknown pieces: only the unknown piece's own text maps to it.
  if (id == impl_->sp.unk_id() && impl_->sp.IdToPiece(id) != piece) return -1;
  return id;
}

bool SentencePieceModel::is_control(int id) const { return impl_->sp.IsControl(id); }

bool SentencePieceModel::is_byte(int id) const { return impl_->sp.IsByte(id); }

int SentencePieceModel::bos_id() const { return impl_->sp.bos_id(); }

}  // namespace ssmserve
