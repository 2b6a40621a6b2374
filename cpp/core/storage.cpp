#include "lowbit/core/storage.h"

#include "lowbit/core/allocator.h"

namespace lowbit {

std::shared_ptr<Storage> Storage::allocate(size_t bytes, const Device& device) {
  Allocator& alloc = allocator_for(device);
  void* p = alloc.allocate(bytes, device);
  return std::shared_ptr<Storage>(
      new Storage(p, bytes, device, [p, bytes, device, &alloc]() { alloc.deallocate(p, bytes, device); }));
}

std::shared_ptr<Storage> Storage::wrap(void* data, size_t bytes, const Device& device,
                                       std::function<void()> release) {
  return std::shared_ptr<Storage>(new Storage(data, bytes, device, std::move(release)));
}

Storage::~Storage() {
  if (release_) release_();
}

}  // namespace lowbit
