/* allocscope BPF, rss.bpf.c: with AS_RSS_TRACEPOINT, the kmem:rss_stat program that keeps the
 * target's RSS counters current (rss.h).
 *
 * A unit of the program (its entry points): see allocscope.c. */
#include "rss.h"

#ifdef AS_RSS_TRACEPOINT
TRACEPOINT_PROBE(kmem, rss_stat)
{
    u32 zero = 0;
    u32 *mm = rss_mm.lookup(&zero);
    if (!mm)
        return 0;
    if (*mm == 0) {
        if (!args->curr || !is_target())
            return 0;
        *mm = args->mm_id;
    } else if (args->mm_id != *mm) {
        return 0;
    }
    u32 m = (u32)args->member;
    if (m >= 4)
        return 0;
    s64 v = args->size;
    rss.update(&m, &v);
    return 0;
}
#endif
