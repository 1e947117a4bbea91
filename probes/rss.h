/* allocscope BPF, rss.h: resident memory: the kernel's RSS counters of the target's mm.
 *
 * Declarations only (types, maps, static inline helpers): see allocscope.c. */
#ifndef AS_RSS_H
#define AS_RSS_H
#include "common.h"

/* --- resident memory: the kernel's RSS counters of the target's mm --------- */
/* Releases (malloc_trim, munmap, madvise, brk) are measured as the drop of the target's anonymous
 * RSS between their entry and return, so the bytes they really gave back are known, not summed
 * from lengths. The counter is read when needed: mm->rss_stat[MM_ANONPAGES] of the current task,
 * at offsets the tracer found in the running kernel's BTF (tracer/bpf/kernel_btf.py) — the same value the
 * kernel's kmem:rss_stat tracepoint reports (percpu_counter's global count). With
 * AS_RSS_TRACEPOINT instead (a kernel whose BTF lacks the layout) a program on that tracepoint
 * keeps a copy current, at the price of one BPF run per RSS change of every process. */
#ifndef AS_RSS_TRACEPOINT
static __always_inline s64 rss_anon(void)
{
    u64 task = bpf_get_current_task(), mm = 0;
    s64 pages = 0;
    bpf_probe_read_kernel(&mm, sizeof(mm), (void *)(task + AS_OFF_TASK_MM));
    if (!mm)
        return 0;
    bpf_probe_read_kernel(&pages, sizeof(pages), (void *)(mm + AS_OFF_MM_ANON));
    return pages * AS_PAGE_SIZE;
}
#else
BPF_ARRAY(rss, s64, 4);
BPF_ARRAY(rss_mm, u32, 1); /* mm_id of the target, learned from its own first rss_stat event */

static __always_inline s64 rss_anon(void)
{
    u32 k = 1;
    s64 *v = rss.lookup(&k);
    return v ? *v : 0;
}
#endif

#endif /* AS_RSS_H */
