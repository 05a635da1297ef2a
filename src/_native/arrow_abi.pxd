# The Arrow C data interface's two structs (https://arrow.apache.org/docs/format/CDataInterface.html),
# for the kernels that read or build record batches through ``_export_to_c`` / ``_import_from_c``
# instead of a pyarrow object per column (``arrow_c``, ``codes.encode_var_batch``).
from libc.stdint cimport int64_t


cdef struct ArrowSchema:
    const char* format
    const char* name
    const char* metadata
    int64_t flags
    int64_t n_children
    ArrowSchema** children
    ArrowSchema* dictionary
    void (*release)(ArrowSchema*) noexcept nogil
    void* private_data


cdef struct ArrowArray:
    int64_t length
    int64_t null_count
    int64_t offset
    int64_t n_buffers
    int64_t n_children
    const void** buffers
    ArrowArray** children
    ArrowArray* dictionary
    void (*release)(ArrowArray*) noexcept nogil
    void* private_data
