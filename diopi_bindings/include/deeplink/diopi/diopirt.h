/* DIOPI's runtime interface (DeepLink's device-independent operator interface, version 1.0): the types an
 * operator library sees and the functions the framework implements for it. A library written against
 * DeepLink's own <diopi/diopirt.h> builds against this header unchanged: the names, signatures and enum
 * values are DIOPI's. Add `-I <diopi_bindings>/include/deeplink` and `#include <diopi/diopirt.h>`.
 *
 * The framework (diopi_bindings._C_diopi) defines every DIOPI_RT_API function; the library defines
 * diopiGetVersion, the DIOPI_API operators of <diopi/functions.h> it implements, and optionally
 * diopiGetVendorName / diopiGetImplVersion / diopiGetLastErrorString. */
#ifndef DIOPI_BINDINGS_DEEPLINK_DIOPIRT_H_
#define DIOPI_BINDINGS_DEEPLINK_DIOPIRT_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DIOPI_ATTR_WEAK __attribute__((weak))
#define DIOPI_ATTR_WEEK DIOPI_ATTR_WEAK /* DeepLink's spelling, kept for sources that use it */
/* Operators are weak: a library defines the ones it implements, the framework finds the rest absent. */
#define DIOPI_API DIOPI_ATTR_WEAK
/* Runtime functions are the framework's, exported for the library to call. */
#define DIOPI_RT_API __attribute__((visibility("default")))

#if defined(__cplusplus)
extern "C" {
#endif

#define DIOPI_VER_MAJOR 1
#define DIOPI_VER_MINOR 0
#define DIOPI_VER_PATCH 0
#define DIOPI_VERSION (DIOPI_VER_MAJOR * 1000 + DIOPI_VER_MINOR * 100 + DIOPI_VER_PATCH)

typedef struct {
  const int64_t* data;
  int64_t len;
} diopiSize_t;

typedef enum {
  diopiSuccess = 0,
  diopiErrorOccurred = 1,
  diopiNotInited = 2,
  diopiNoRegisteredStreamCreateFunction = 3,
  diopiNoRegisteredStreamDestoryFunction = 4,
  diopiNoRegisteredStreamSyncFunction = 5,
  diopiNoRegisteredDeviceMemoryMallocFunction = 6,
  diopiNoRegisteredDeviceMemoryFreeFunction = 7,
  diopiNoRegisteredDevice2DdeviceMemoryCopyFunction = 8,
  diopiNoRegisteredDevice2HostMemoryCopyFunction = 9,
  diopiNoRegisteredHost2DeviceMemoryCopyFunction = 10,
  diopiNoRegisteredGetLastErrorFunction = 11,
  diopi5DNotSupported = 12,
  diopiNoImplement = 13,       /* the framework runs the operator on the CPU instead */
  diopiForceFallbackToCPU = 14, /* the same, chosen by the library for these arguments */
  diopiDtypeNotSupported = 1000,
} diopiError_t;

typedef enum {
  diopi_host = 0,
  diopi_device = 1,
} diopiDevice_t;

typedef int8_t diopiDeviceIndex_t;

/* Ordered by increasing precision, as DIOPI's dtype inference expects. */
typedef enum {
  diopi_dtype_int8 = 0,
  diopi_dtype_uint8 = 1,
  diopi_dtype_int16 = 2,
  diopi_dtype_uint16 = 3,
  diopi_dtype_int32 = 4,
  diopi_dtype_uint32 = 5,
  diopi_dtype_int64 = 6,
  diopi_dtype_uint64 = 7,
  diopi_dtype_float16 = 8,
  diopi_dtype_float32 = 9,
  diopi_dtype_float64 = 10,
  diopi_dtype_bool = 11,
  diopi_dtype_bfloat16 = 12,
  diopi_dtype_tfloat32 = 13,
  diopi_dtype_complex32 = 14,
  diopi_dtype_complex64 = 15,
  diopi_dtype_complex128 = 16,
  diopi_dtype_unsupported = 255
} diopiDtype_t;

/* A tagged scalar: stype says which member holds the value (a floating dtype: fval, else ival). */
typedef struct {
  diopiDtype_t stype;
  union {
    double fval;
    int64_t ival;
  };
} diopiScalar_t;

typedef enum { Contiguous = 0, ChannelsLast = 1, ChannelsLast3d = 2, Preserve = 3, ChannelsLast1d = 4 } diopiMemoryFormat_t;
typedef enum { ReductionNone, ReductionMean, ReductionSum, ReductionEND } diopiReduction_t;
typedef enum { RoundModeNone, RoundModeTrunc, RoundModeFloor, RoundModeEND } diopiRoundMode_t;

/* Opaque: a library reads them only through the functions below. */
struct diopiContext;
typedef struct diopiContext* diopiContextHandle_t;
struct diopiTensor;
typedef struct diopiTensor* diopiTensorHandle_t;
typedef const struct diopiTensor* diopiConstTensorHandle_t;
struct diopiGenerator;
typedef struct diopiGenerator* diopiGeneratorHandle_t;
typedef const struct diopiGenerator* diopiConstGeneratorHandle_t;
typedef void* diopiStreamHandle_t;

/* Defined by the library: "DIOPI Version: MAJOR.MINOR.PATCH" of the header it was built against. The
 * framework refuses a library without it, or of another major version. */
extern DIOPI_API const char* diopiGetVersion();

/* Tensors. Shape and stride stay valid while the handle does (the call); strides are in elements. */
extern DIOPI_RT_API diopiError_t diopiGetTensorData(diopiTensorHandle_t th, void** data);
extern DIOPI_RT_API diopiError_t diopiGetTensorDataConst(diopiConstTensorHandle_t th, const void** data);
extern DIOPI_RT_API diopiError_t diopiGetTensorShape(diopiConstTensorHandle_t th, diopiSize_t* size);
extern DIOPI_RT_API diopiError_t diopiGetTensorStride(diopiConstTensorHandle_t th, diopiSize_t* stride);
extern DIOPI_RT_API diopiError_t diopiGetTensorDtype(diopiConstTensorHandle_t th, diopiDtype_t* dtype);
extern DIOPI_RT_API diopiError_t diopiGetTensorDevice(diopiConstTensorHandle_t th, diopiDevice_t* device);
extern DIOPI_RT_API diopiError_t diopiGetTensorNumel(diopiConstTensorHandle_t th, int64_t* numel);
extern DIOPI_RT_API diopiError_t diopiGetTensorElemSize(diopiConstTensorHandle_t th, int64_t* itemsize);
extern DIOPI_RT_API diopiError_t diopiGetTensorStoragePtr(diopiConstTensorHandle_t th, void** storage);
extern DIOPI_RT_API diopiError_t diopiGetTensorStorageOffset(diopiConstTensorHandle_t th, int64_t* offset);
extern DIOPI_RT_API diopiError_t diopiGetTensorStorageNbytes(diopiConstTensorHandle_t th, size_t* nbytes);
extern DIOPI_RT_API diopiError_t diopiGetTensorDeviceIndex(diopiConstTensorHandle_t th, diopiDeviceIndex_t* index);

/* The call's stream: the calling thread's current stream of the call's device, as the device runtime made it
 * (diopi_stream_create). A library may queue its work there and return: the framework synchronizes the
 * stream before the host reads or writes device memory. NULL when the runtime has no streams: then the work
 * is complete when the operator returns. */
extern DIOPI_RT_API diopiError_t diopiGetStream(diopiContextHandle_t ctx, diopiStreamHandle_t* stream);
/* A tensor owned by the framework until the call returns (stride NULL: contiguous), on the call's device
 * (diopi_device) or in host memory (diopi_host). */
extern DIOPI_RT_API diopiError_t diopiRequireTensor(diopiContextHandle_t ctx, diopiTensorHandle_t* tensor, const diopiSize_t* size,
                                                    const diopiSize_t* stride, const diopiDtype_t dtype, const diopiDevice_t device);
/* num_bytes of scratch: an int8 tensor, as diopiRequireTensor. */
extern DIOPI_RT_API diopiError_t diopiRequireBuffer(diopiContextHandle_t ctx, diopiTensorHandle_t* tensor, int64_t num_bytes,
                                                    diopiDevice_t device);

/* Generators: the state is a uint8 tensor (torch's layout for the device's generator). */
extern DIOPI_RT_API diopiError_t diopiGeneratorGetState(diopiContextHandle_t ctx, diopiConstGeneratorHandle_t th, diopiTensorHandle_t* data);
extern DIOPI_RT_API diopiError_t diopiGeneratorSetState(diopiGeneratorHandle_t th, diopiConstTensorHandle_t state);
extern DIOPI_RT_API diopiError_t diopiGeneratorGetSeedAndOffset(diopiGeneratorHandle_t th, uint64_t* seed, uint64_t* offset);
extern DIOPI_RT_API diopiError_t diopiGeneratorSetSeedAndOffset(diopiGeneratorHandle_t th, uint64_t seed, uint64_t offset);

/* Profiler ranges (accepted and ignored). */
extern DIOPI_RT_API diopiError_t diopiRecordStart(const char* record_name, void** record);
extern DIOPI_RT_API diopiError_t diopiRecordEnd(void** record);

#if defined(__cplusplus)
}
#endif

#endif /* DIOPI_BINDINGS_DEEPLINK_DIOPIRT_H_ */
