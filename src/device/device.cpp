// Owns the device layer (see device.h, cuda_check.h).
#include "device/device.h"

#include <fmt/format.h>

#include "core/error.h"
#include "device/cuda_check.h"

namespace ssmserve::cuda {

void check(cudaError_t e, const char* what, const char* file, int line) {
  if (e == cudaSuccess) return;
  cudaGetLastError();  // clear a non-sticky error so later calls start clean
  fail("CUDA error {} ({}) in {} at {}:{}", cudaGetErrorName(e), cudaGetErrorString(e), what, file, line);
}

void check(cublasStatus_t s, const char* what, const char* file, int line) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  fail("cuBLASLt error {} in {} at {}:{}", static_cast<int>(s), what, file, line);
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::string device_description(int dev) {
  cudaDeviceProp p{};
  SSM_CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
  return fmt::format("{} (sm_{}{}, {} SMs, {:.1f} GiB)", p.name, p.major, p.minor, p.multiProcessorCount,
                     static_cast<double>(p.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0));
}

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  const cudaError_t e = cudaMalloc(&ptr_, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    ptr_ = nullptr;
    fail("cudaMalloc of {} bytes failed: {}", bytes, cudaGetErrorString(e));
  }
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cudaFree(ptr_);
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void DeviceBuffer::upload(const void* src, size_t n, size_t offset) {
  SSM_CHECK(offset <= bytes_ && n <= bytes_ - offset, "DeviceBuffer::upload: {} bytes at {} exceed {}", n, offset, bytes_);
  if (n) SSM_CUDA_CHECK(cudaMemcpy(static_cast<char*>(ptr_) + offset, src, n, cudaMemcpyHostToDevice));
}

void DeviceBuffer::download(void* dst, size_t n, size_t offset) const {
  SSM_CHECK(offset <= bytes_ && n <= bytes_ - offset, "DeviceBuffer::download: {} bytes at {} exceed {}", n, offset, bytes_);
  if (n) SSM_CUDA_CHECK(cudaMemcpy(dst, static_cast<const char*>(ptr_) + offset, n, cudaMemcpyDeviceToHost));
}

void DeviceBuffer::upload_async(const void* src, size_t n, cudaStream_t stream, size_t offset) {
  SSM_CHECK(offset <= bytes_ && n <= bytes_ - offset, "DeviceBuffer::upload_async: {} bytes at {} exceed {}", n, offset, bytes_);
  if (n) SSM_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(ptr_) + offset, src, n, cudaMemcpyHostToDevice, stream));
}

void DeviceBuffer::fill_bytes(int value) {
  if (bytes_) SSM_CUDA_CHECK(cudaMemset(ptr_, value, bytes_));
}

// A blocking stream: it is ordered with the legacy default stream, which the synchronous copies and memsets of
// DeviceBuffer (uploads from pageable memory may still be in flight when cudaMemcpy returns) run on.
Stream::Stream() { SSM_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamDefault)); }

Stream::~Stream() {
  if (s_) cudaStreamDestroy(s_);
}

void Stream::synchronize() const { SSM_CUDA_CHECK(cudaStreamSynchronize(s_)); }

}  // namespace ssmserve::cuda
