# The C types every kernel of ``dbsp._native`` shares (declarations only, no code).
#
# A *code* is the normalized key of one row (see ``dbsp.algebra.codes``): either one ``uint64``
# (``code_t``) or a variable-length byte string held Arrow-style by ``VarCodes``
# (``offsets`` int64 n+1, ``data`` uint8), borrowed here as a ``var_t``.
# Row positions and weights are int64 everywhere (numpy ``int64`` arrays at the Python edge).
from libc.stdint cimport uint8_t, int32_t, uint32_t, int64_t, uint64_t

ctypedef uint64_t code_t    # a u64 code: compare unsigned
ctypedef int64_t idx_t      # a row position
ctypedef int64_t weight_t   # a Z-set weight

# A u64 sort key and the row it belongs to: the element the radix sort moves.
ctypedef struct kv_t:
    uint64_t key
    int64_t idx

# The same with the row's weight, when the row index fits 32 bits and the weight fits int32: the
# consolidating sort moves it with the key instead of gathering weights at random afterwards.
ctypedef struct kw_t:
    uint64_t key
    uint32_t idx
    int32_t w

# A borrowed view of a VarCodes: row i is data[offsets[i]:offsets[i+1]].
ctypedef struct var_t:
    const int64_t* offsets
    const uint8_t* data
    int64_t n

# A borrowed view of any code array: u64 (``u64 != NULL``) or var.
ctypedef struct codes_t:
    const uint64_t* u64
    var_t var
    int64_t n
