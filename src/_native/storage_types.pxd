# cython: language_level=3
"""Inline C helpers shared by the storage kernels (``block``, ``uring``, ``slab_pool``).

Cython modules here cannot call each other's ``cdef`` functions at run time, so everything two
storage modules both need lives in this header as ``inline`` C:

* ``dbsp_crc32c(crc, buf, len)``: CRC-32C (Castagnoli), the block checksum of the layer file
  format. Bit-identical to the ``crc32c`` PyPI package (tests check it). On x86-64 with SSE4.2
  it uses the ``crc32`` instruction over three interleaved streams (about 25 GB/s); otherwise a
  byte table. Pure C, callable ``nogil``.
* ``dbsp_fmix64`` / ``dbsp_hash_bytes``: 64-bit hashes for the Bloom filter over key codes.
  They are part of the file format (a filter written by one build must answer in another), so
  they must never change without a format version bump.
"""
from libc.stdint cimport uint8_t, uint32_t, uint64_t, int64_t

cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>
    #if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    #include <nmmintrin.h>
    #define DBSP_CRC_X86 1
    #endif

    #define DBSP_CRC_POLY 0x82F63B78u

    static uint32_t dbsp_crc_table[256];
    static uint32_t dbsp_crc_k_long, dbsp_crc_k_short;
    /* shifting a register over LONG / SHORT zero bytes is linear: four byte tables each */
    static uint32_t dbsp_crc_sh_long[4][256], dbsp_crc_sh_short[4][256];
    static volatile int dbsp_crc_ready = 0;
    static int dbsp_crc_hw = 0;

    /* a * b modulo the CRC polynomial, reflected (zlib's multmodp) */
    static uint32_t dbsp_crc_multmodp(uint32_t a, uint32_t b) {
        uint32_t m = (uint32_t)1 << 31, p = 0;
        for (;;) {
            if (a & m) {
                p ^= b;
                if ((a & (m - 1)) == 0) break;
            }
            m >>= 1;
            b = (b & 1) ? (b >> 1) ^ DBSP_CRC_POLY : b >> 1;
        }
        return p;
    }

    /* x^(8 * nbytes) mod P: shifts a CRC register over nbytes zero bytes */
    static uint32_t dbsp_crc_shift_const(uint64_t nbytes) {
        uint32_t x8 = (uint32_t)1 << 31, p = (uint32_t)1 << 31; /* p = 1 */
        uint32_t sq = 0;
        int i;
        /* x^8 */
        for (i = 0; i < 8; i++) x8 = (x8 & 1) ? (x8 >> 1) ^ DBSP_CRC_POLY : x8 >> 1;
        sq = x8;
        while (nbytes) {
            if (nbytes & 1) p = dbsp_crc_multmodp(sq, p);
            sq = dbsp_crc_multmodp(sq, sq);
            nbytes >>= 1;
        }
        return p;
    }

    #define DBSP_CRC_LONG 8192
    #define DBSP_CRC_SHORT 256

    static void dbsp_crc_init(void) {
        uint32_t i, j, c;
        if (dbsp_crc_ready) return;
        for (i = 0; i < 256; i++) {
            c = i;
            for (j = 0; j < 8; j++) c = (c & 1) ? (c >> 1) ^ DBSP_CRC_POLY : c >> 1;
            dbsp_crc_table[i] = c;
        }
        dbsp_crc_k_long = dbsp_crc_shift_const(DBSP_CRC_LONG);
        dbsp_crc_k_short = dbsp_crc_shift_const(DBSP_CRC_SHORT);
        for (j = 0; j < 4; j++) {
            for (i = 0; i < 256; i++) {
                dbsp_crc_sh_long[j][i] = dbsp_crc_multmodp(dbsp_crc_k_long, i << (8 * j));
                dbsp_crc_sh_short[j][i] = dbsp_crc_multmodp(dbsp_crc_k_short, i << (8 * j));
            }
        }
    #ifdef DBSP_CRC_X86
        dbsp_crc_hw = __builtin_cpu_supports("sse4.2");
    #endif
        dbsp_crc_ready = 1;
    }

    static uint32_t dbsp_crc_sw(uint32_t r, const uint8_t *p, size_t n) {
        while (n--) r = (r >> 8) ^ dbsp_crc_table[(r ^ *p++) & 0xff];
        return r;
    }

    static inline uint32_t dbsp_crc_shift(uint32_t t[4][256], uint32_t r) {
        return t[0][r & 0xff] ^ t[1][(r >> 8) & 0xff] ^ t[2][(r >> 16) & 0xff] ^ t[3][r >> 24];
    }

    #ifdef DBSP_CRC_X86
    __attribute__((target("sse4.2")))
    static uint32_t dbsp_crc_hw_run(uint32_t r32, const uint8_t *p, size_t n) {
        uint64_t r = r32;
        while (n && ((uintptr_t)p & 7)) { r = _mm_crc32_u8((uint32_t)r, *p++); n--; }
        /* three interleaved streams, combined by shifting over zeros (Adler's crc32c.c) */
        while (n >= 3 * DBSP_CRC_LONG) {
            uint64_t r1 = 0, r2 = 0;
            const uint8_t *end = p + DBSP_CRC_LONG;
            do {
                r = _mm_crc32_u64(r, *(const uint64_t *)p);
                r1 = _mm_crc32_u64(r1, *(const uint64_t *)(p + DBSP_CRC_LONG));
                r2 = _mm_crc32_u64(r2, *(const uint64_t *)(p + 2 * DBSP_CRC_LONG));
                p += 8;
            } while (p < end);
            r = dbsp_crc_shift(dbsp_crc_sh_long, (uint32_t)r) ^ (uint32_t)r1;
            r = dbsp_crc_shift(dbsp_crc_sh_long, (uint32_t)r) ^ (uint32_t)r2;
            p += 2 * DBSP_CRC_LONG;
            n -= 3 * DBSP_CRC_LONG;
        }
        while (n >= 3 * DBSP_CRC_SHORT) {
            uint64_t r1 = 0, r2 = 0;
            const uint8_t *end = p + DBSP_CRC_SHORT;
            do {
                r = _mm_crc32_u64(r, *(const uint64_t *)p);
                r1 = _mm_crc32_u64(r1, *(const uint64_t *)(p + DBSP_CRC_SHORT));
                r2 = _mm_crc32_u64(r2, *(const uint64_t *)(p + 2 * DBSP_CRC_SHORT));
                p += 8;
            } while (p < end);
            r = dbsp_crc_shift(dbsp_crc_sh_short, (uint32_t)r) ^ (uint32_t)r1;
            r = dbsp_crc_shift(dbsp_crc_sh_short, (uint32_t)r) ^ (uint32_t)r2;
            p += 2 * DBSP_CRC_SHORT;
            n -= 3 * DBSP_CRC_SHORT;
        }
        while (n >= 8) { r = _mm_crc32_u64(r, *(const uint64_t *)p); p += 8; n -= 8; }
        while (n) { r = _mm_crc32_u8((uint32_t)r, *p++); n--; }
        return (uint32_t)r;
    }
    #endif

    /* CRC-32C of buf, continuing from crc (0 to start), like crc32c.crc32c(buf, crc) */
    static inline uint32_t dbsp_crc32c(uint32_t crc, const void *buf, size_t n) {
        uint32_t r;
        if (!dbsp_crc_ready) dbsp_crc_init();
        r = ~crc;
    #ifdef DBSP_CRC_X86
        if (dbsp_crc_hw) return ~dbsp_crc_hw_run(r, (const uint8_t *)buf, n);
    #endif
        return ~dbsp_crc_sw(r, (const uint8_t *)buf, n);
    }

    /* murmur3's 64-bit finalizer with a seed: a bijection, good avalanche */
    static inline uint64_t dbsp_fmix64(uint64_t k, uint64_t seed) {
        k ^= seed;
        k ^= k >> 33; k *= 0xff51afd7ed558ccdULL;
        k ^= k >> 33; k *= 0xc4ceb9fe1a85ec53ULL;
        k ^= k >> 33;
        return k;
    }

    /* 64-bit hash of a byte string: 8 bytes at a time, then the tail and the length */
    static inline uint64_t dbsp_hash_bytes(const uint8_t *p, size_t n, uint64_t seed) {
        uint64_t h = seed ^ (0x9E3779B97F4A7C15ULL * (uint64_t)(n + 1)), w;
        while (n >= 8) {
            memcpy(&w, p, 8);
            h ^= dbsp_fmix64(w, 0x2545F4914F6CDD1DULL);
            h = ((h << 27) | (h >> 37)) * 5 + 0x52dce729;
            p += 8; n -= 8;
        }
        w = 0;
        if (n) memcpy(&w, p, n);
        h ^= dbsp_fmix64(w ^ ((uint64_t)n << 56), 0x2545F4914F6CDD1DULL);
        return dbsp_fmix64(h, seed);
    }
    """
    uint32_t dbsp_crc32c(uint32_t crc, const void *buf, size_t n) nogil
    uint64_t dbsp_fmix64(uint64_t k, uint64_t seed) nogil
    uint64_t dbsp_hash_bytes(const uint8_t *p, size_t n, uint64_t seed) nogil

# Block header layout (see dbsp.storage.format for the whole format): the fields native code
# reads when it verifies a block it has just read.
cdef enum:
    DBSP_BLOCK_MAGIC = 0x42534244   # b"DBSB" read as a little-endian u32
    DBSP_HDR_SIZE = 64
    DBSP_HDR_CHECKSUM = 4           # u32 at byte 4: crc32c of bytes [8, extent)
    DBSP_HDR_EXTENT = 12            # u32 at byte 12: bytes on disk, multiple of 4096
