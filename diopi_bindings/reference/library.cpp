// What every DIOPI library exports besides its operators: ABI version, vendor, version, last error.
#include "tensor_io.h"

namespace diopi_ref {
const char* last_error_message();
}

extern "C" {
DIOPI_API uint32_t diopi_abi_version(void) { return DIOPI_ABI_VERSION; }
DIOPI_API const char* diopi_vendor_name(void) { return "reference-cpu"; }
DIOPI_API const char* diopi_impl_version(void) { return "0.1.0"; }
DIOPI_API const char* diopi_last_error(void) { return diopi_ref::last_error_message(); }
}
