// Owns the framework-free device layer of the CUDA backend: GPU discovery, owning device buffers and streams.
// Every failing call throws ssmserve::Error (cuda_check.h); nothing here depends on a framework.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace ssmserve::cuda {

/// Number of usable CUDA devices; 0 when there is no driver, no device, or the driver is too old (never throws).
int device_count();
/// device_count() > 0.
inline bool gpu_available() { return device_count() > 0; }
/// "NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB)" for device `dev`. Throws Error when it cannot be queried.
std::string device_description(int dev = 0);

/// An owning device allocation of `bytes` bytes (cudaMalloc; never managed memory). Move-only. A zero-byte
/// buffer holds nullptr. Throws Error when the allocation fails (naming the size).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; o.bytes_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return ptr_; }
  template <class T>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }

  /// Synchronous copies of `n` bytes from / to host memory at byte offset `offset`; throw Error on overflow.
  void upload(const void* src, size_t n, size_t offset = 0);
  void download(void* dst, size_t n, size_t offset = 0) const;
  /// Asynchronous on `stream` (host memory must stay valid until the stream reaches the copy).
  void upload_async(const void* src, size_t n, cudaStream_t stream, size_t offset = 0);
  /// Sets every byte to `value` (synchronous).
  void fill_bytes(int value);

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

/// Uploads a host vector into a new buffer of exactly its size.
template <class T>
DeviceBuffer to_device(std::span<const T> v) {
  DeviceBuffer b(v.size_bytes());
  if (!v.empty()) b.upload(v.data(), v.size_bytes());
  return b;
}
template <class T>
DeviceBuffer to_device(const std::vector<T>& v) { return to_device(std::span<const T>(v)); }
/// Downloads `n` elements of T from the start of `b`.
template <class T>
std::vector<T> to_host(const DeviceBuffer& b, size_t n) {
  std::vector<T> v(n);
  if (n) b.download(v.data(), n * sizeof(T));
  return v;
}

/// An owning CUDA stream, ordered with the legacy default stream (so DeviceBuffer's synchronous uploads and
/// memsets complete before later work on it). Move-only.
class Stream {
 public:
  Stream();
  ~Stream();
  Stream(Stream&& o) noexcept : s_(o.s_) { o.s_ = nullptr; }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  Stream& operator=(Stream&&) = delete;
  cudaStream_t get() const { return s_; }
  /// Waits for all work on the stream; throws Error on any asynchronous failure it reports.
  void synchronize() const;

 private:
  cudaStream_t s_ = nullptr;
};

}  // namespace ssmserve::cuda
