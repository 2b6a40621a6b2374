// DLPack exchange, zero-copy both ways. The struct layout follows the DLPack ABI (v0.8 legacy
// "dltensor" capsule form), declared here so lowbit needs no third-party header.
#pragma once
#include <cstdint>

#include "lowbit/core/tensor.h"

extern "C" {
typedef enum { kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3 } DLDeviceType;
typedef struct { int32_t device_type; int32_t device_id; } DLDevice;
typedef enum { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLFloat8_e4m3fn = 10, kDLFloat8_e5m2 = 12 } DLDataTypeCode;
typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } DLDataType;
typedef struct {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
} DLTensor;
typedef struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(struct DLManagedTensor* self);
} DLManagedTensor;
// DLPack >= 1.0 capsule form ("dltensor_versioned"); numpy treats legacy capsules as read-only.
typedef struct { uint32_t major; uint32_t minor; } DLPackVersion;
typedef struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(struct DLManagedTensorVersioned* self);
  uint64_t flags;  // bit 0: read-only, bit 1: is a copy
  DLTensor dl_tensor;
} DLManagedTensorVersioned;
}

namespace lowbit {

// Exports `t`; the returned tensor keeps t's storage alive until its deleter runs.
// Sub-byte tensors are exported as their raw bytes (u8, last dim in bytes).
DLManagedTensor* to_dlpack(const Tensor& t);
DLManagedTensorVersioned* to_dlpack_versioned(const Tensor& t);  // DLPack 1.0, writable
// Imports a producer's tensor; the producer's deleter runs when the last lowbit view dies.
// Takes ownership of `managed` (even when it throws).
Tensor from_dlpack(DLManagedTensor* managed);

}  // namespace lowbit
