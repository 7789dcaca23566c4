/* DIOPI runtime types: what a framework hands an operator library, and what the library exports
 * besides operators. Plain C, no dependency beyond <stdint.h>/<stdbool.h>, so any toolchain builds
 * against it. The operator prototypes are generated into functions.h from diopi_bindings/schema.py. */
#ifndef DIOPI_DIOPIRT_H_
#define DIOPI_DIOPIRT_H_

#include <stdbool.h>
#include <stdint.h>

#define DIOPI_VERSION_MAJOR 0
#define DIOPI_VERSION_MINOR 2
#define DIOPI_VERSION_PATCH 0
/* Bumped whenever a struct below or an operator signature changes incompatibly. A framework refuses
 * a library whose diopi_abi_version() differs from the one it was built for. */
#define DIOPI_ABI_VERSION 1

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define DIOPI_API __declspec(dllexport)
#else
#define DIOPI_API __attribute__((visibility("default")))
#endif

typedef enum {
  DIOPI_SUCCESS = 0,
  DIOPI_ERR_NOT_IMPLEMENTED = 1, /* an argument combination this library does not support */
  DIOPI_ERR_INVALID_ARGUMENT = 2, /* shapes or scalars that do not fit the operator */
  DIOPI_ERR_DTYPE = 3,            /* a dtype the operator does not declare */
  DIOPI_ERR_ALLOCATION = 4,
  DIOPI_ERR_INTERNAL = 5,
} diopiError_t;

typedef enum {
  DIOPI_DTYPE_BOOL = 0,
  DIOPI_DTYPE_INT32 = 1,
  DIOPI_DTYPE_INT64 = 2,
  DIOPI_DTYPE_FLOAT16 = 3,
  DIOPI_DTYPE_BFLOAT16 = 4,
  DIOPI_DTYPE_FLOAT32 = 5,
  DIOPI_DTYPE_FLOAT64 = 6,
} diopiDtype_t;

typedef enum {
  DIOPI_DEVICE_HOST = 0,
  DIOPI_DEVICE_DEVICE = 1,
} diopiDevice_t;

/* A strided view of memory owned by the framework. Shape and strides have ndim entries; strides are
 * in elements and may be 0 (broadcast) or describe a transpose. ndim 0 is a scalar (one element). */
typedef struct diopiTensor {
  void* data;
  int64_t ndim;
  const int64_t* shape;
  const int64_t* strides;
  diopiDtype_t dtype;
  diopiDevice_t device;
} diopiTensor;

typedef diopiTensor* diopiTensorHandle_t;
typedef const diopiTensor* diopiConstTensorHandle_t;

/* A list of integers (dims, a normalised shape). */
typedef struct diopiSize {
  const int64_t* data;
  int64_t len;
} diopiSize_t;

/* A list of const input tensors (cat's inputs), passed by value like diopiSize_t: `data` points at
 * `len` handles, valid for the duration of the call. An argument of kind in?[] (index's indices) may
 * hold NULL entries: an absent optional tensor. */
typedef struct diopiTensorList {
  const diopiConstTensorHandle_t* data;
  int64_t len;
} diopiTensorList_t;

/* The context of one call: the stream to run on and the framework's allocator. A kernel that needs
 * scratch memory, or an output whose size depends on the data, asks the framework through these
 * callbacks so memory stays accounted to the framework's caching allocator. */
typedef struct diopiContext {
  void* stream; /* opaque to the framework; NULL on a device without streams */
  void* allocator_state;
  void* (*allocate)(void* allocator_state, int64_t nbytes);
  void (*release)(void* allocator_state, void* ptr);
  /* Fills *out with a new tensor of the given shape and dtype, owned by the framework. */
  diopiError_t (*require_tensor)(void* allocator_state, diopiTensorHandle_t* out, int64_t ndim,
                                 const int64_t* shape, diopiDtype_t dtype);
} diopiContext;

typedef diopiContext* diopiContextHandle_t;

/* Exported by every library (the framework refuses one without them). */
DIOPI_API uint32_t diopi_abi_version(void);
DIOPI_API const char* diopi_vendor_name(void);
DIOPI_API const char* diopi_impl_version(void);
/* The message of the last failed call on the calling thread ("" if none). */
DIOPI_API const char* diopi_last_error(void);

/* Device memory (optional, since 0.2: additive, the ABI version is unchanged). A library that exports
 * all of them gets a real torch device: tensors whose memory comes from diopi_device_malloc, copies
 * through diopi_memcpy_*, several devices. A library without them is served by the framework's
 * host-memory stand-in. Devices are numbered 0..count-1; an index out of range, a pointer this
 * library did not allocate on that device, or a copy that runs past its allocation is
 * DIOPI_ERR_INVALID_ARGUMENT (with diopi_last_error() saying which), never a crash. Copies are
 * synchronous with respect to the host unless the library documents otherwise; then
 * diopi_device_synchronize waits for everything queued on the device. */
#if defined(_WIN32)
#define DIOPI_RUNTIME_WEAK
#else
#define DIOPI_RUNTIME_WEAK __attribute__((weak))
#endif
DIOPI_API DIOPI_RUNTIME_WEAK diopiError_t diopi_device_count(int32_t* count);
DIOPI_API DIOPI_RUNTIME_WEAK diopiError_t diopi_set_device(int32_t device);
DIOPI_API DIOPI_RUNTIME_WEAK diopiError_t diopi_get_device(int32_t* device);
/* nbytes 0 yields a valid pointer that may be freed (or NULL). */
DIOPI_API DIOPI_RUNTIME_WEAK diopiError_t diopi_device_malloc(int32_t device, int64_t nbytes, void** ptr);
DIOPI_API DIOPI_RUNTIME_WEAK diopiError_t diopi_device_free(int32_t device, void* ptr);
DIOPI_API DIOPI_RUNTIME_WEAK diopiError_t diopi_memcpy_h2d(int32_t device, void* dst, const void* src,
                                                           int64_t nbytes);
DIOPI_API DIOPI_RUNTIME_WEAK diopiError_t diopi_memcpy_d2h(int32_t device, void* dst, const void* src,
                                                           int64_t nbytes);
DIOPI_API DIOPI_RUNTIME_WEAK diopiError_t diopi_memcpy_d2d(int32_t dst_device, void* dst, int32_t src_device,
                                                           const void* src, int64_t nbytes);
DIOPI_API DIOPI_RUNTIME_WEAK diopiError_t diopi_device_synchronize(int32_t device);

/* Streams and events (optional, all or none; additive, the ABI version is unchanged). A library that
 * exports them may run its operators asynchronously: the framework passes the calling thread's current
 * stream of the device to every DeepLink DIOPI operator (diopiGetStream) and, before the host reads or
 * writes device memory through the synchronous diopi_memcpy_* above, and before it calls an operator of
 * this ABI (whose diopiContext.stream stays NULL: it completes before it returns), synchronizes that stream. Work on one stream runs in the order it was queued. diopi_device_synchronize waits for every
 * stream of the device. A library without them completes each call before it returns (streams are NULL).
 * diopi_stream_query and diopi_event_query set *done to 1 when everything queued before is complete. */
DIOPI_API DIOPI_RUNTIME_WEAK diopiError_t diopi_stream_create(int32_t device, void** stream);
DIOPI_API DIOPI_RUNTIME_WEAK diopiError_t diopi_stream_destroy(int32_t device, void* stream);
DIOPI_API DIOPI_RUNTIME_WEAK diopiError_t diopi_stream_synchronize(int32_t device, void* stream);
DIOPI_API DIOPI_RUNTIME_WEAK diopiError_t diopi_stream_query(int32_t device, void* stream, int32_t* done);
/* Queued on `stream`: the host memory must stay valid until the stream reaches the copy. */
DIOPI_API DIOPI_RUNTIME_WEAK diopiError_t diopi_memcpy_h2d_async(int32_t device, void* dst, const void* src,
                                                                 int64_t nbytes, void* stream);
DIOPI_API DIOPI_RUNTIME_WEAK diopiError_t diopi_memcpy_d2h_async(int32_t device, void* dst, const void* src,
                                                                 int64_t nbytes, void* stream);
DIOPI_API DIOPI_RUNTIME_WEAK diopiError_t diopi_event_create(int32_t device, void** event);
DIOPI_API DIOPI_RUNTIME_WEAK diopiError_t diopi_event_destroy(int32_t device, void* event);
/* Marks the point of `stream` reached by the work queued so far. */
DIOPI_API DIOPI_RUNTIME_WEAK diopiError_t diopi_event_record(int32_t device, void* event, void* stream);
DIOPI_API DIOPI_RUNTIME_WEAK diopiError_t diopi_event_query(int32_t device, void* event, int32_t* done);
DIOPI_API DIOPI_RUNTIME_WEAK diopiError_t diopi_event_synchronize(int32_t device, void* event);
/* Work queued on `stream` after this call starts once the event's point is reached. */
DIOPI_API DIOPI_RUNTIME_WEAK diopiError_t diopi_stream_wait_event(int32_t device, void* stream, void* event);

#ifdef __cplusplus
}
#endif

#endif /* DIOPI_DIOPIRT_H_ */
