#include "base/bulk_allocator.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <new>

namespace nibble {

void* AllocateBulk(size_t bytes) {
  if (bytes < kHugePageBytes) {
    return ::operator new(bytes);
  }
  // Not rounded up to whole huge pages: the tail past the last whole one
  // stays in small pages, and untouched pages cost no memory.
  void* p = nullptr;
  if (posix_memalign(&p, kHugePageBytes, bytes) != 0) throw std::bad_alloc();
  AdviseHugePages(p, bytes);
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
