/* allocscope agent: the layout the tracer (tracer/inject/agent.py, ctypes mirror) and the agent share.
 * Bump AS_AGENT_VERSION with any change here. */
#ifndef AS_AGENT_H
#define AS_AGENT_H

#define AS_AGENT_MAGIC 0x31746e6567617361ULL /* "asagent1" */
#define AS_AGENT_VERSION 6
#define AS_MAX_HOOKS 96
#define AS_THREAD_PROBES 8 /* slots tried per thread key (probes/regions.h reads as many) */
#define AS_SET_SPILL 4     /* buckets a sampled pointer may land in */
#define AS_FILTER_PAGE 12  /* the filter's granule: one count per 4 KiB page of address space */
#define AS_FILTER_LINE 6   /* 64 counts a line: the pages of a 256 KiB region share one */
/* The mmap family, hooked like the allocators (agent.c "the mmap family"): mmap, munmap, mremap,
 * madvise, brk; up to AS_SYS_DEFS definitions of each (libc's, a static libc's in the executable,
 * an allocator's own), each its own hook (these take up to 6 arguments: no register is free to
 * carry a slot). */
enum as_sys_kind {
    AS_SYS_MMAP = 0,
    AS_SYS_MUNMAP = 1,
    AS_SYS_MREMAP = 2,
    AS_SYS_MADVISE = 3,
    AS_SYS_BRK = 4,
    AS_SYS_KINDS = 5
};
#define AS_SYS_DEFS 4

enum as_state { AS_STATE_LOADING = 0, AS_STATE_HOOKED = 1, AS_STATE_DETACHING = 2, AS_STATE_UNHOOKED = 3 };
enum as_watchdog { AS_WD_NONE = 0, AS_WD_RUNNING = 1, AS_WD_EXITED = 2 };

/* One hooked function, beside its stub: the trampoline to the real code, and its cookie. */
struct as_slot {
    u64 orig;
    u64 cookie; /* enum as_api | source << 16, as the probes' link cookies */
};

/* One thread (key: its thread pointer), a cache line each. While a hooked call runs, api names it
 * and depth is 1; sp/ra: its stack slot and return address (probes/regions.h agent_api reads
 * offsets 16, 24, 32). */
struct as_thread {
    u64 key;
    u64 rng;
    u64 sp; /* the open call's stack slot holding its return address */
    u64 ra; /* that return address */
    union {
        struct {
            u32 api;   /* the running call (enum as_api), 0: none */
            u32 depth; /* 1 while a hooked call runs: calls made inside it pass through */
        };
        u64 call; /* both, set and cleared in one store */
    };
    u32 sys; /* 1 while a hooked mmap-family call runs: one definition calling another reports once */
    u32 spare1;
    u64 spare[2];
};

/* What a hooked mmap-family call reports to the markers (probes/syscalls.h mark_sys reads it):
 * the system call's number, its arguments as the kernel takes them, and its result as the
 * system call returned it (a new address, 0, or -errno; brk: the break after the call). */
struct as_sysrec {
    u64 nr;
    u64 a[5];
    u64 ret;
};

/* What the watchdog puts back when the tracer dies: the aligned word(s) holding a patched entry. */
struct as_restore {
    u64 word_addr; /* 8-aligned (16-aligned when wide) */
    u64 orig_word, patched_word;
    u64 orig_hi, patched_hi; /* wide: the second word */
    u64 page, page_len;      /* for mprotect */
    u32 prot;                /* the page's protection to restore */
    u32 wide;                /* 1: a 16-byte compare-and-swap */
    u32 done;                /* 1: restored, 2: could not make the page writable */
    u32 pad;
};

struct as_config {
    u64 magic;
    u32 version, size;
    volatile u32 enabled; /* 0: every hook passes straight through */
    volatile u32 state;   /* enum as_state */
    volatile u32 watchdog;
    u32 pid;   /* the target (a fork's child has another) */
    s32 pidfd; /* the tracer's pidfd, in the target */
    u32 poll_ms;
    u64 sample_bytes;
    u64 threads; /* struct as_thread[1 << thread_bits] */
    u64 set;     /* u64[8 << set_bits] */
    u64 spill;   /* u8[1 << set_bits]: pointers homed in each bucket */
    u32 thread_bits, set_bits;
    u32 nhooks, filter_bits;
    u64 filter; /* u8[1 << filter_bits]: sampled pointers in each page (agent.c "the filter") */
    struct as_restore hooks[AS_MAX_HOOKS];
    /* counters (the tracer reads them at the end) */
    volatile u64 sampled, freed, set_full, thread_overflow, foreign;
    /* the mmap family: the trampoline of each hooked definition (0: not hooked), the markers
     * called (one per reported call: two for munmap, madvise, brk) */
    u64 sys_orig[AS_SYS_KINDS][AS_SYS_DEFS];
    volatile u64 sys_marks;
    /* a word on a page of its own, madvise(MADV_WIPEONFORK): 1 in the traced process, 0 in a fork's
     * child (0 here: no such page, the hooks ask getpid) */
    u64 guard;
};

#endif
