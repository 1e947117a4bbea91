/* allocscope BPF, lifetime.bpf.c: threads and process lifetime: renames, exits, exec.
 *
 * A unit of the program (its entry points): see allocscope.c. */
#include "common.h"
#include "regions.h"
#include "waits.h"

/* --- threads and process lifetime ----------------------------------------- */

TRACEPOINT_PROBE(task, task_rename)
{
    if (!is_target())
        return 0;
    struct as_event *e = new_event(AS_EV_THREAD_NAME, (u32)args->pid);
    if (!e)
        return 0;
    bpf_probe_read_kernel(&e->comm, sizeof(e->comm), args->newcomm);
    submit(e);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exit)
{
    if (!is_target())
        return 0;
    u32 tid = current_tid();
    sysargs.delete(&tid); /* `inflight` is task storage: the kernel frees it with the thread */
    wait_memo.delete(&tid);
    offcpu.delete(&tid);
    if (args->group_dead) {
        u32 zero = 0, one = 1;
        gone.update(&zero, &one); /* the pid may be reused from now on */
    }
    struct as_event *e = new_event(AS_EV_THREAD_EXIT, tid);
    if (!e)
        return 0;
    e->ret = args->group_dead;
    submit(e);
    return 0;
}

/* Processes the target forks (not its threads): child pid -> when, for the tracer to read and
 * delete each interval (tracer/record/children.py: a forking daemon's work is in its children,
 * not traced, and the report says so); fork_count[0]: every one, the map full or not. */
BPF_HASH(forks, u32, u64, 1024);
BPF_ARRAY(fork_count, u64, 1);

TRACEPOINT_PROBE(task, task_newtask)
{
    if (!is_target() || (args->clone_flags & 0x00010000 /* CLONE_THREAD */))
        return 0;
    u32 pid = (u32)args->pid, zero = 0;
    u64 now = bpf_ktime_get_ns();
    forks.update(&pid, &now);
    u64 *n = fork_count.lookup(&zero);
    if (n)
        __sync_fetch_and_add(n, 1);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exec)
{
    if ((bpf_get_current_pid_tgid() >> 32) != AS_TGID)
        return 0;
    if (AS_LAUNCHED) {
        u32 zero = 0, one = 1;
        u32 *a = armed.lookup(&zero);
        if (a && *a == 0) {
            armed.update(&zero, &one); /* the launched command starts: trace from here */
            return 0;
        }
    }
    if (target_gone())
        return 0; /* a reused pid exec'ing: not ours */
    u32 zero_g = 0, one_g = 1;
    gone.update(&zero_g, &one_g); /* the new program is not traced */
    struct as_event *e = new_event(AS_EV_EXEC, current_tid());
    if (!e)
        return 0;
    submit(e);
    return 0;
}
