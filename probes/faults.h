/* allocscope BPF, faults.h: residency mode: sampled first touches (page-fault perf events).
 *
 * Declarations only (types, maps, static inline helpers): see allocscope.c. */
#ifndef AS_FAULTS_H
#define AS_FAULTS_H
#include "common.h"
#include "stacks.h"
#include "python.h"
#include "heap.h"

/* --- residency mode: sampled first touches ---------------------------------------------------
 * With AS_FAULTS (allocscope record --mode residency) no allocator probe is attached: memory is
 * seen where the kernel hands it out — the mmap family above, and user page faults here. The
 * tracer opens a software perf event (page faults) on every thread of the target with a sample
 * period of AS_FAULT_SAMPLE, inherited by threads created later: the kernel only counts faults,
 * and this program runs on one in AS_FAULT_SAMPLE, which stands for AS_FAULT_SAMPLE pages charged
 * to the faulting stack and thread in `fault_sites` (alloc_bytes / alloc_count; nothing is ever
 * freed here). Stacks go through the per-thread stack cache: a loop touching the pages of a
 * buffer faults at the same few (ip, sp) and is unwound once. */
#ifdef AS_FAULTS
#include <uapi/linux/bpf_perf_event.h>
#ifndef AS_FAULT_SAMPLE
#error "AS_FAULT_SAMPLE: set by the tracer (tracer/bpf/source.py, probe_cflags)"
#endif
BPF_F_TABLE("hash", struct as_site_key, struct as_site, fault_sites, AS_MAX_SITES, BPF_F_NO_PREALLOC);

static __always_inline void fault_charge(u64 sid)
{
    struct as_site_key k = {.stack_id = sid, .tid = current_tid(), .source = AS_SRC_FAULT};
    struct as_site *s = fault_sites.lookup(&k);
    if (!s) {
        struct as_site z = {};
        fault_sites.insert(&k, &z);
        s = fault_sites.lookup(&k);
        if (!s) {
            count(AS_LOST_SITE_FULL, 1);
            return;
        }
    }
    __sync_fetch_and_add(&s->alloc_bytes, AS_FAULT_SAMPLE * AS_PAGE_SIZE);
    __sync_fetch_and_add(&s->alloc_count, AS_FAULT_SAMPLE);
    s->peak_live_bytes = s->alloc_bytes;
}

/* A sample charged to its native stack `sid` with the thread's Python frames (python.h), as an
 * allocation's: a first touch is named by the Python line that touched the page. */
static __always_inline void fault_charge_py(u64 sid)
{
    fault_charge(py_stack(current_tid(), sid));
}

#if defined(AS_UNWIND_DWARF) && AS_SCACHE_WAYS > 0
BPF_PROG_ARRAY(ftails, 2); /* 0: fault_unwind, 1: fault_keep (perf-event programs) */
#endif
#endif

#endif /* AS_FAULTS_H */
