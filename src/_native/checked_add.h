/* Checked int64 addition for the weight sums of the native kernels (merge, merge_pairs, sort).
 *
 * dbsp_add_ovf(a, b, &r) stores the wrapped a + b in r and returns 1 when the exact sum leaves
 * the int64 range (GCC/Clang __builtin_add_overflow: an add and a seto, no branch). Kernels OR
 * the results into one flag per call; a set flag only means that *some partial sum* wrapped, so
 * the Python layer (dbsp.algebra.kernels) then decides exactly which groups' final sums are out
 * of range: modular arithmetic makes every final sum that fits right whatever its partial sums
 * did, so a false alarm costs a slow check, never a wrong answer.
 */
#ifndef DBSP_CHECKED_ADD_H
#define DBSP_CHECKED_ADD_H
#include <stdint.h>

static inline int dbsp_add_ovf(int64_t a, int64_t b, int64_t* r)
{
    return __builtin_add_overflow(a, b, r);
}

#endif
