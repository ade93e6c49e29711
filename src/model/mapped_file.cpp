// Owns the POSIX implementation of MappedFile (open + fstat + mmap(PROT_READ), munmap on destruction).
#include "model/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace ssmserve {

MappedFile::MappedFile(const std::filesystem::path& path) : path_(path) {
  // O_NONBLOCK: opening a fifo must not wait for a writer (fstat below then rejects it); no effect on regular files.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int e = errno;
    if (e == ELOOP) fail("{}: cannot open: symlink loop (too many levels of symbolic links)", path.string());
    if (e == ENOENT) {
      struct stat lst {};
      if (::lstat(path.c_str(), &lst) == 0 && S_ISLNK(lst.st_mode))
        fail("{}: cannot open: dangling symlink (its target does not exist)", path.string());
    }
    fail("{}: cannot open: {}", path.string(), std::strerror(e));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    fail("{}: cannot stat: {}", path.string(), std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    const char* kind = S_ISDIR(st.st_mode) ? "a directory" : S_ISCHR(st.st_mode) ? "a character device"
                       : S_ISBLK(st.st_mode) ? "a block device" : S_ISFIFO(st.st_mode) ? "a fifo (named pipe)"
                       : "a special file";
    fail("{}: is {}, not a regular file", path.string(), kind);
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      fail("{}: cannot mmap {} bytes: {}", path.string(), size_, std::strerror(e));
    }
    data_ = static_cast<const std::byte*>(p);
  }
  ::close(fd);  // the mapping keeps the file alive
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
}

}  // namespace ssmserve
