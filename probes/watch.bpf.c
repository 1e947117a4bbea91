/* allocscope BPF, watch.bpf.c: the night watch's gate (allocscope watch, tracer/watch/gate.py).
 *
 * A program of its own, apart from allocscope.c: it is loaded for the watcher's whole life, also
 * while no recording runs. When a process execs a program whose name (comm, set by the exec) is
 * watched, it is stopped before its first instruction (SIGSTOP from the exec tracepoint, delivered
 * on the way back to user space) and its pid is put in `held`: the watcher attaches its probes to
 * it and lets it run, so a restarted daemon is traced from its first allocation. The watcher
 * releases (SIGCONT) every pid in `held` it does not follow; a guardian process holding only this
 * map's fd does it when the watcher itself is killed. */
#include <uapi/linux/ptrace.h>

#define WATCH_SIGSTOP 19
#define WATCH_COMMS 64
#define WATCH_HELD 1024

struct watch_comm {
    char comm[16];
};

struct watch_event {
    u32 pid;
    u32 kind; /* 1: stopped at its exec; 2: stopped at a file mapped executable (follow) */
    u64 ts_ns;
};

BPF_HASH(watched, struct watch_comm, u8, WATCH_COMMS);
/* An incarnation being attached (pid -> until, CLOCK_MONOTONIC ns): until then, each file the
 * loader maps executable stops it again (kind 2), so that the tracer loads that library's unwind
 * rows before its code runs; the tracer lets it go once it has (tracer/record/events.py). */
BPF_HASH(follow, u32, u64, WATCH_COMMS);
BPF_HASH(exec_maps, u64, u8, WATCH_HELD); /* pid_tgid -> an executable file mmap in flight */
BPF_HASH(held, u32, u64, WATCH_HELD);
BPF_ARRAY(watch_counts, u64, 2); /* 0: holds, 1: holds refused (held table full) */
BPF_RINGBUF_OUTPUT(watch_events, 4);

TRACEPOINT_PROBE(sched, sched_process_exec)
{
    struct watch_comm key = {};
    bpf_get_current_comm(&key.comm, sizeof(key.comm));
    if (!watched.lookup(&key))
        return 0;
    u32 pid = bpf_get_current_pid_tgid() >> 32;
    u64 now = bpf_ktime_get_ns();
    int slot = 0;
    /* never stop a process the watcher might not know of: only with its pid in `held` */
    if (held.insert(&pid, &now) != 0) {
        slot = 1;
        u64 *n = watch_counts.lookup(&slot);
        if (n)
            __sync_fetch_and_add(n, 1);
        return 0;
    }
    bpf_send_signal(WATCH_SIGSTOP);
    u64 *n = watch_counts.lookup(&slot);
    if (n)
        __sync_fetch_and_add(n, 1);
    struct watch_event ev = {.pid = pid, .kind = 1, .ts_ns = now};
    watch_events.ringbuf_output(&ev, sizeof(ev), 0);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_mmap)
{
    u32 pid = bpf_get_current_pid_tgid() >> 32;
    if (!follow.lookup(&pid) || !(args->prot & 4 /* PROT_EXEC */) || (long)args->fd < 0)
        return 0;
    u64 id = bpf_get_current_pid_tgid();
    u8 one = 1;
    exec_maps.update(&id, &one);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_exit_mmap)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!exec_maps.lookup(&id))
        return 0;
    exec_maps.delete(&id);
    u32 pid = id >> 32;
    u64 *until = follow.lookup(&pid);
    u64 now = bpf_ktime_get_ns();
    if (!until || args->ret < 0)
        return 0;
    if (now > *until) {
        follow.delete(&pid);
        return 0;
    }
    if (held.insert(&pid, &now) != 0)
        return 0; /* held already (or the table is full): never a stop the watcher does not know of */
    bpf_send_signal(WATCH_SIGSTOP);
    struct watch_event ev = {.pid = pid, .kind = 2, .ts_ns = now};
    watch_events.ringbuf_output(&ev, sizeof(ev), 0);
    return 0;
}
