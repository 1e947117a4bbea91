/* allocscope BPF, stack_store.h: store_stack(), a walked stack hashed and kept in `stacks`, for
 * stacks.h (frame pointers) and unwind_dwarf.h (DWARF) alike.
 *
 * Declarations only (types, maps, static inline helpers): see allocscope.c. */
#ifndef AS_STACK_STORE_H
#define AS_STACK_STORE_H
#include "common.h"

/* Hash the stack and keep it in `stacks`. bpf_get_stack zero-fills the
 * buffer past the frames it wrote, so hashing up to the first zero slot is
 * the same as hashing `depth` frames, and keeps the loop simple enough for
 * the verifier. */
static __always_inline u64 store_stack(struct as_stack *st)
{
    u64 h = 0xcbf29ce484222325ULL ^ st->flags ^ (st->extra * 0x9e3779b97f4a7c15ULL);
    for (u32 i = 0; i < AS_MAX_DEPTH; i++) {
        u64 ip = st->ips[i];
        if (ip == 0)
            break;
        h ^= ip;
        h *= 0x100000001b3ULL;
        h ^= h >> 29;
    }
    if (h == 0)
        h = 1;
    if (stacks.lookup(&h))
        return h;
    int err = stacks.insert(&h, st);
    if (err != 0 && err != -EEXIST) {
        count(AS_LOST_STACK_FULL, 1);
        return 0;
    }
    return h;
}

#endif /* AS_STACK_STORE_H */
