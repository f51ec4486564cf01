// Memory for large arrays that are written whole right after they are made,
// such as a packed weight or a weight converted from a checkpoint. Writing
// fresh memory first costs a page fault per page; asking for transparent
// huge pages makes that one fault per 2 MiB instead of one per 4 KiB, which
// for a gigabyte of weights is a large share of the time to load them.
// BulkAllocator also leaves elements uninitialized on resize instead of
// zeroing them; ReserveBulk gets the huge pages for a std::vector.
//
// Example:
//   std::vector<uint32_t, nibble::BulkAllocator<uint32_t>> codes;
//   codes.resize(n);  // not zeroed: write every element before reading it
//   std::vector<uint16_t> scales;
//   nibble::ReserveBulk(scales, m);
//   scales.resize(m);
#ifndef NIBBLE_BASE_BULK_ALLOCATOR_H_
#define NIBBLE_BASE_BULK_ALLOCATOR_H_

#include <cstddef>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace nibble {

// Allocates `bytes`, huge-page aligned and advised when that many; never
// null (throws std::bad_alloc like operator new).
void* AllocateBulk(size_t bytes);
void FreeBulk(void* p, size_t bytes);

inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// Advises the whole huge pages within [p, p + bytes) to be huge pages when
// first touched; a hint, without effect on memory already touched.
void AdviseHugePages(void* p, size_t bytes);

// Gives `v` room for `count` elements without touching it, advised as
// AdviseHugePages does, so that filling it faults once per huge page: for
// arrays of the standard allocator that are about to be filled.
template <typename T, typename Allocator>
void ReserveBulk(std::vector<T, Allocator>& v, size_t count) {
  if (v.capacity() >= count) return;
  v.reserve(count);
  AdviseHugePages(v.data(), count * sizeof(T));
}

template <typename T>
class BulkAllocator {
 public:
  static_assert(std::is_trivially_copyable_v<T>);
  using value_type = T;

  BulkAllocator() = default;
  template <typename U>
  explicit BulkAllocator(const BulkAllocator<U>&) {}

  T* allocate(size_t count) {
    return static_cast<T*>(AllocateBulk(count * sizeof(T)));
  }
  void deallocate(T* p, size_t count) { FreeBulk(p, count * sizeof(T)); }

  // Default-initializes: no zeroing on resize.
  template <typename U>
  void construct(U* p) {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }

  template <typename U>
  bool operator==(const BulkAllocator<U>&) const {
    return true;
  }
};

}  // namespace nibble

#endif  // NIBBLE_BASE_BULK_ALLOCATOR_H_
