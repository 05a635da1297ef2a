/* AVX-512 step of the two-run u64 merge in merge.pyx (``merge2_u64``), picked at run time.
 *
 * One step emits the next 8 rows of the stable merge of two sorted u64 runs a and b (ties: a's
 * row first) and consolidates them into the open output group, with no branch on the keys:
 *
 *   1. how many of the 8 come from a: with A = a[i..i+8) and R = b[j..j+8) reversed, the mask
 *      A[k] <= R[k] is k < c (merge path across the anti-diagonal), so c = popcount; the 8 rows
 *      are a[i..i+c) and b[j..j+8-c), and lane k of blend(mask, R, A) holds them as a bitonic
 *      sequence (ascending, then descending);
 *   2. a bitonic merge network (distances 4, 2, 1) sorts the 8 keys, moving beside them a lane
 *      index 0..15 (0..7: A's lanes, 8..15: B's); two two-source permutes then fetch the global
 *      rows and the weights of the sorted lanes. The network is not stable, so equal keys inside
 *      one step come out in any order: their group's first row is taken as the *minimum* global
 *      row (the stable first, since a's rows come first and a's base is below b's);
 *   3. consolidation: when no key equals its predecessor (the open group's key for lane 0), the
 *      open group and lanes 0..6 close, lane 7 opens the next group: 8 (row, sum) pairs stored at
 *      once, compressed when a sum is zero. Otherwise a segmented scan over the lanes (sums,
 *      and minimum rows, of equal keys) and a compressed store of the groups that close.
 *
 * Each step advances i by c and j by 8 - c, so it interleaves freely with the scalar code. The
 * stores write 8 slots at the output position o, which stays below the rows consumed so far
 * (the open group holds at least one), so they never pass the end of an output sized to the
 * input rows.
 *
 * Without x86-64 GCC/Clang the header only defines dbsp_merge_avx512_supported() returning 0.
 */
#ifndef DBSP_MERGE_SIMD_H
#define DBSP_MERGE_SIMD_H

#include <stdint.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define DBSP_MERGE_HAVE_AVX512 1
#include <immintrin.h>

static int dbsp_merge_avx512_supported(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("popcnt");
}

#define DBSP_AVX512 __attribute__((target("avx512f,popcnt")))

/* Compare-exchange at one distance of the bitonic network: P is the partner lane's key (and PX
 * its index); lanes in ``upper`` take the larger key. Ties keep their own key and index on both
 * sides, so no index is duplicated. */
#define DBSP_BITONIC_STAGE(PERM, UPPER)                                                         \
    do {                                                                                       \
        __m512i P = PERM(L), PX = PERM(X);                                                     \
        __mmask8 keep = _mm512_mask_cmple_epu64_mask((__mmask8)~(UPPER), L, P)                 \
                        | _mm512_mask_cmpge_epu64_mask((UPPER), L, P);                         \
        L = _mm512_mask_blend_epi64(keep, P, L);                                               \
        X = _mm512_mask_blend_epi64(keep, PX, X);                                              \
    } while (0)

#define DBSP_SWAP4(x) _mm512_shuffle_i64x2((x), (x), _MM_SHUFFLE(1, 0, 3, 2))
#define DBSP_SWAP2(x) _mm512_permutex_epi64((x), _MM_SHUFFLE(1, 0, 3, 2))
#define DBSP_SWAP1(x) _mm512_shuffle_epi32((x), _MM_PERM_BADC)

/* W += X in the lanes of mask M, recording in ``wrapped`` the lanes whose signed sum overflowed
 * (operands of one sign, result of the other: the sign bit of ~(W ^ X) & (W ^ R)). */
#define DBSP_ADD_CHECKED(W, M, X) do {                                                       \
        __m512i x_ = (X);                                                                      \
        __m512i r_ = _mm512_mask_add_epi64((W), (M), (W), x_);                                 \
        __m512i t_ = _mm512_andnot_si512(_mm512_xor_si512((W), x_), _mm512_xor_si512((W), r_)); \
        wrapped |= _mm512_mask_cmplt_epi64_mask((M), t_, _mm512_setzero_si512());            \
        (W) = r_;                                                                              \
    } while (0)

/* Run ``steps`` 8-row steps (the caller guarantees 8 rows left on both sides for each). The
 * open output group (key, first row, running sum) must be open on entry; it is read from and
 * written back to *key, *first, *s. */
DBSP_AVX512 static void dbsp_merge2_avx512(
    const uint64_t* a, const int64_t* wa, const uint64_t* b, const int64_t* wb,
    int64_t* ip, int64_t* jp, int64_t steps, int64_t ba, int64_t bb,
    int64_t* og, int64_t* ow, int64_t* op, uint64_t* key, int64_t* first, int64_t* s, int* ovf)
{
    __mmask8 wrapped = 0;   /* lanes where a masked add of weights overflowed */
    const __m512i iota = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i rev = _mm512_set_epi64(0, 1, 2, 3, 4, 5, 6, 7);
    const __m512i from_b = _mm512_set_epi64(8, 9, 10, 11, 12, 13, 14, 15);  /* lane k: B[7-k] */
    int64_t i = *ip, j = *jp, o = *op;
    /* the open group sits in lane 7 of pk / pg / pw */
    __m512i pk = _mm512_set1_epi64((long long)*key);
    __m512i pg = _mm512_set1_epi64(*first);
    __m512i pw = _mm512_set1_epi64(*s);
    for (int64_t t = 0; t < steps; t++) {
        __m512i A = _mm512_loadu_si512((const void*)(a + i));
        __m512i R = _mm512_permutexvar_epi64(rev, _mm512_loadu_si512((const void*)(b + j)));
        __mmask8 ta = _mm512_cmple_epu64_mask(A, R);
        int c = __builtin_popcount((unsigned)ta);
        __m512i L = _mm512_mask_blend_epi64(ta, R, A);
        __m512i X = _mm512_mask_blend_epi64(ta, from_b, iota);
        DBSP_BITONIC_STAGE(DBSP_SWAP4, 0xF0);
        DBSP_BITONIC_STAGE(DBSP_SWAP2, 0xCC);
        DBSP_BITONIC_STAGE(DBSP_SWAP1, 0xAA);
        __m512i G = _mm512_permutex2var_epi64(_mm512_add_epi64(_mm512_set1_epi64(ba + i), iota), X,
                                              _mm512_add_epi64(_mm512_set1_epi64(bb + j), iota));
        __m512i W = _mm512_permutex2var_epi64(_mm512_loadu_si512((const void*)(wa + i)), X,
                                              _mm512_loadu_si512((const void*)(wb + j)));
        i += c;
        j += 8 - c;
        __mmask8 same = _mm512_cmpeq_epu64_mask(L, _mm512_alignr_epi64(L, pk, 7));
        if (__builtin_expect(same == 0, 1)) {
            /* the open group and lanes 0..6 close; lane 7 opens */
            __m512i eg = _mm512_alignr_epi64(G, pg, 7);
            __m512i ew = _mm512_alignr_epi64(W, pw, 7);
            __mmask8 nz = _mm512_test_epi64_mask(ew, ew);
            if (__builtin_expect(nz == 0xFF, 1)) {
                _mm512_storeu_si512((void*)(og + o), eg);
                _mm512_storeu_si512((void*)(ow + o), ew);
                o += 8;
            } else {
                _mm512_storeu_si512((void*)(og + o), _mm512_maskz_compress_epi64(nz, eg));
                _mm512_storeu_si512((void*)(ow + o), _mm512_maskz_compress_epi64(nz, ew));
                o += __builtin_popcount((unsigned)nz);
            }
            pk = L;
            pg = G;
            pw = W;
        } else {
            /* Equal keys: a segmented scan (sums, minimum rows) over the 8 lanes, then the open
             * group's sum and first row folded into the lanes that continue it. Keys are sorted,
             * so lanes r and r - d share a group iff their keys are equal; lanes below 0 hold
             * the scan's identity (0, INT64_MAX). */
            const __m512i seven = _mm512_set1_epi64(7);
            const __m512i zero = _mm512_setzero_si512();
            const __m512i top = _mm512_set1_epi64(INT64_MAX);
            __mmask8 m2 = _mm512_cmpeq_epu64_mask(L, _mm512_alignr_epi64(L, pk, 6));
            __mmask8 m4 = _mm512_cmpeq_epu64_mask(L, _mm512_alignr_epi64(L, pk, 4));
            __mmask8 cont = _mm512_cmpeq_epu64_mask(L, _mm512_permutexvar_epi64(seven, pk));
            DBSP_ADD_CHECKED(W, same, _mm512_alignr_epi64(W, zero, 7));
            G = _mm512_mask_min_epi64(G, same, G, _mm512_alignr_epi64(G, top, 7));
            DBSP_ADD_CHECKED(W, m2, _mm512_alignr_epi64(W, zero, 6));
            G = _mm512_mask_min_epi64(G, m2, G, _mm512_alignr_epi64(G, top, 6));
            DBSP_ADD_CHECKED(W, m4, _mm512_alignr_epi64(W, zero, 4));
            G = _mm512_mask_min_epi64(G, m4, G, _mm512_alignr_epi64(G, top, 4));
            DBSP_ADD_CHECKED(W, cont, _mm512_permutexvar_epi64(seven, pw));
            G = _mm512_mask_min_epi64(G, cont, G, _mm512_permutexvar_epi64(seven, pg));
            /* lane t of (open, lanes 0..6) closes its group iff lane t's key differs from the
             * one before it, i.e. bit t of ~same */
            __m512i eg = _mm512_alignr_epi64(G, pg, 7);
            __m512i ew = _mm512_alignr_epi64(W, pw, 7);
            __mmask8 emit = _mm512_mask_test_epi64_mask((__mmask8)~same, ew, ew);
            _mm512_storeu_si512((void*)(og + o), _mm512_maskz_compress_epi64(emit, eg));
            _mm512_storeu_si512((void*)(ow + o), _mm512_maskz_compress_epi64(emit, ew));
            o += __builtin_popcount((unsigned)emit);
            pk = L;
            pg = G;
            pw = W;
        }
    }
    {
        int64_t kk[8], gg[8], ww[8];
        _mm512_storeu_si512((void*)kk, pk);
        _mm512_storeu_si512((void*)gg, pg);
        _mm512_storeu_si512((void*)ww, pw);
        *key = (uint64_t)kk[7];
        *first = gg[7];
        *s = ww[7];
    }
    *ip = i;
    *jp = j;
    *op = o;
    *ovf |= wrapped != 0;
}

#undef DBSP_ADD_CHECKED
#undef DBSP_BITONIC_STAGE
#undef DBSP_SWAP4
#undef DBSP_SWAP2
#undef DBSP_SWAP1
#undef DBSP_AVX512

#else /* not x86-64 GCC/Clang */
#define DBSP_MERGE_HAVE_AVX512 0

static int dbsp_merge_avx512_supported(void) { return 0; }

static void dbsp_merge2_avx512(
    const uint64_t* a, const int64_t* wa, const uint64_t* b, const int64_t* wb,
    int64_t* ip, int64_t* jp, int64_t steps, int64_t ba, int64_t bb,
    int64_t* og, int64_t* ow, int64_t* op, uint64_t* key, int64_t* first, int64_t* s, int* ovf)
{
    (void)ovf;
    (void)a; (void)wa; (void)b; (void)wb; (void)ip; (void)jp; (void)steps; (void)ba; (void)bb;
    (void)og; (void)ow; (void)op; (void)key; (void)first; (void)s;
}
#endif

#endif /* DBSP_MERGE_SIMD_H */
