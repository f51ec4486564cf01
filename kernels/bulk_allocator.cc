#include "kernels/bulk_allocator.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <new>

namespace nibble {

void* AllocateBulk(size_t bytes) {
  if (bytes < kHugePageBytes) {
    return ::operator new(bytes);
  }
  const size_t rounded =
      (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  void* p = std::aligned_alloc(kHugePageBytes, rounded);
  if (p == nullptr) throw std::bad_alloc();
  // Only a hint: where the kernel has no transparent huge pages, the memory
  // works the same with small ones.
  (void)madvise(p, rounded, MADV_HUGEPAGE);
  return p;
}

void AdviseHugePages(void* p, size_t bytes) {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p);
  const uintptr_t first =
      (begin + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  const uintptr_t end = (begin + bytes) / kHugePageBytes * kHugePageBytes;
  if (first < end) {
    (void)madvise(reinterpret_cast<void*>(first), end - first, MADV_HUGEPAGE);
  }
}

void FreeBulk(void* p, size_t bytes) {
  if (bytes < kHugePageBytes) {
    ::operator delete(p);
  } else {
    std::free(p);
  }
}

}  // namespace nibble
