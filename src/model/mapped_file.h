// Owns read-only memory mappings of checkpoint files (RAII around open/fstat/mmap/munmap).
#pragma once
#include <cstddef>
#include <filesystem>
#include <string>

namespace ssmserve {

/// A whole file mapped read-only into memory for the object's lifetime. Empty files are allowed (data() is
/// then nullptr and size() 0). Not copyable; movable only through unique_ptr.
class MappedFile {
 public:
  /// Maps `path` read-only. Throws Error naming the path when it is missing, not a regular file, or cannot be
  /// opened or mapped (with the system's reason).
  explicit MappedFile(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  /// First byte of the mapping (nullptr for an empty file).
  const std::byte* data() const { return data_; }
  /// File size in bytes.
  size_t size() const { return size_; }
  /// The path it was opened from.
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace ssmserve
