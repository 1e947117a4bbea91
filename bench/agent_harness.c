/* bench/agent_free.py: one version of the agent (tracer/inject/agent/agent.c, included whole) with the
 * hooks called directly instead of through patched entries, so that a benchmark can hold two
 * versions side by side (each object's symbols get a prefix: objcopy --prefix-symbols). The
 * tracer's part is played by hx_init: the tables, the configuration, the hooks' slots. */
#include "agent.c"

static struct as_slot hx_malloc_slot, hx_free_slot;

HIDDEN u64 hx_tables_bytes(u32 filter_bits)
{
    u64 n = (64ULL << 14) + (64ULL << 17) + (1ULL << 17);
#ifdef AS_FILTER_PAGE
    n += 1ULL << filter_bits;
#else
    (void)filter_bits;
#endif
    return n;
}

/* tables: zeroed, as large as hx_tables_bytes says; orig_*: the real malloc and free; filter_bits:
 * the filter's size (tracer/inject/agent.py FILTER_BITS: 14) */
HIDDEN void hx_init(u64 tables, u64 sample_bytes, u32 pid, u64 orig_malloc, u64 orig_free, u32 filter_bits)
{
    as_cfg.threads = tables;
    as_cfg.thread_bits = 14;
    as_cfg.set_bits = 17;
    as_cfg.set = tables + (64ULL << 14);
    as_cfg.spill = as_cfg.set + (64ULL << 17);
#ifdef AS_FILTER_PAGE
    as_cfg.filter = as_cfg.spill + (1ULL << 17);
    as_cfg.filter_bits = filter_bits;
#else
    (void)filter_bits;
#endif
    as_cfg.sample_bytes = sample_bytes;
    as_cfg.pid = pid;
    as_cfg.state = AS_STATE_HOOKED;
    hx_malloc_slot.orig = orig_malloc;
    hx_malloc_slot.cookie = 1;
    hx_free_slot.orig = orig_free;
    hx_free_slot.cookie = 7;
    as_cfg.enabled = 1;
}

HIDDEN u64 hx_malloc(u64 n)
{
    return as_h_malloc(n, 0, 0, &hx_malloc_slot);
}

HIDDEN void hx_free(u64 p)
{
    as_h_free(p, 0, 0, &hx_free_slot);
}

/* Of the n pointers at pool: how many pass the first level (the filter, or in the version
 * without one the counts), how many pass both, and the live sampled blocks (sampled - freed). */
HIDDEN void hx_levels(const u64 *pool, u64 n, u64 *first, u64 *both, u64 *live)
{
    u64 f = 0, b = 0;
    for (u64 i = 0; i < n; i++) {
        u64 p = pool[i];
        if (!p)
            continue;
        int c = ((u8 *)as_cfg.spill)[bucket_of(p)] != 0;
#ifdef AS_FILTER_PAGE
        int l1 = *filter_of(p) != 0;
#else
        int l1 = c;
#endif
        f += l1;
        b += l1 && c;
    }
    *first = f;
    *both = b;
    *live = as_cfg.sampled - as_cfg.freed;
}
