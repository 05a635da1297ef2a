/* The rank-directory loop of search.pyx's ``intersect``, with a hardware popcount picked at
 * run time.
 *
 * Each sorted probe code x (inside the directory's range) is placed at
 * ``counts[w] + popcount(bits[w] & (2^r - 1))`` (``x - lo = 64 w + r``) and kept when bit r of
 * ``bits[w]`` is set. A portable build (no ``-mpopcnt``, as a wheel is) computes the popcount
 * with a dozen shifts and masks: twice the instructions of the whole dense-ids loop, paid for
 * every probe of a hash-sharded id key (two or more workers) and never with one worker. The same
 * loop compiled for the ``popcnt`` instruction (GCC / Clang ``target`` attribute, chosen once
 * with ``__builtin_cpu_supports``) costs one instruction for it.
 *
 * Layout of ``rk`` (``code_rank``): ``[lo, nw, bits[0..nw), counts[0..nw)]``. Outputs: ``pa`` /
 * ``pb`` (room for ``na - a1 + 1`` entries: the store happens before the keep test); returns the
 * number of matches.
 */
#ifndef DBSP_RANK_PLACE_H
#define DBSP_RANK_PLACE_H

#include <stdint.h>

static inline uint64_t dbsp_popcount_sw(uint64_t x) {
    x = x - ((x >> 1) & 0x5555555555555555ULL);
    x = (x & 0x3333333333333333ULL) + ((x >> 2) & 0x3333333333333333ULL);
    x = (x + (x >> 4)) & 0x0F0F0F0F0F0F0F0FULL;
    return (x * 0x0101010101010101ULL) >> 56;
}

#define DBSP_RANK_LOOP(POP)                                                              \
    int64_t o = 0;                                                                       \
    const uint64_t *bits = rk + 2, *cnt = rk + 2 + rnw;                                  \
    for (int64_t i = a1; i < na; i++) {                                                  \
        uint64_t rd = ua[i] - rlo, w = rd >> 6, r = rd & 63, word = bits[w];             \
        pa[o] = i;                                                                       \
        pb[o] = (int64_t)(cnt[w] + POP(word & ((((uint64_t)1) << r) - 1)));              \
        o += (int64_t)((word >> r) & 1);                                                 \
    }                                                                                    \
    return o;

static int64_t dbsp_rank_place_sw(const uint64_t *ua, int64_t a1, int64_t na,
                                  const uint64_t *rk, uint64_t rlo, int64_t rnw,
                                  int64_t *pa, int64_t *pb) {
    DBSP_RANK_LOOP(dbsp_popcount_sw)
}

#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
__attribute__((target("popcnt")))
static int64_t dbsp_rank_place_hw(const uint64_t *ua, int64_t a1, int64_t na,
                                  const uint64_t *rk, uint64_t rlo, int64_t rnw,
                                  int64_t *pa, int64_t *pb) {
    DBSP_RANK_LOOP(__builtin_popcountll)
}

static int dbsp_popcnt_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("popcnt") ? 1 : 0;
}
#else
#define dbsp_rank_place_hw dbsp_rank_place_sw
static int dbsp_popcnt_supported(void) { return 0; }
#endif

#endif
