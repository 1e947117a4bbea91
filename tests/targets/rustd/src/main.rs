//! rustd: the shape of a Rust GPU proving daemon (issue 19), with known allocations.
//!
//!   rustd --partitions N --hold H [--mb MB] [--records R] [--gpu-ms MS]
//!
//! * a rayon pool of 4 threads named `synth-0`..`synth-3` builds N partitions in an
//!   `into_par_iter().map(..)`: work stealing puts `synthesize_partition` under many different
//!   stacks (rayon's join/bridge recursion to varying depths). Each partition is a `Vec<u64>`
//!   grown by `push` until it holds MB MiB: its allocation is reallocated up to exactly
//!   MB * 2^20 bytes (a power of two when MB is one: Vec doubles from 4 elements);
//! * the partitions go through `sync_channel(1)` to the thread `gpu`, which keeps the last H
//!   alive (a VecDeque) and drops the older ones; it also allocates one staging buffer of
//!   STAGING_BYTES in `gpu_staging_buffer`, kept. With --gpu-ms it spends MS per partition
//!   (a sleep), so the synth threads block in `hand_off`'s `send`, each holding its partition;
//! * meanwhile a tokio runtime (2 workers named `tokio-rt`) runs a task that allocates R request
//!   records of RECORD_BYTES each in `make_request_record`, all kept (main holds them).
//! * `#[global_allocator]` is `Jem`, over the `_rjem_*` jemalloc that jemalloc-sys builds and
//!   links statically (malloc / calloc / realloc / sdallocx, and the *allocx ones for
//!   over-aligned layouts: tikv-jemallocator's choice).
//!
//! The protocol of tests/support.py's record_run: the threads are started, then the program
//! prints `ready <pid>` and waits for SIGUSR1 (the tracer attaches meanwhile); it does the work,
//! prints `done {json}` (the ground truth: partition_bytes, partitions, partitions_live, ...)
//! and holds everything until SIGUSR1, SIGTERM or SIGINT, when it exits 0.
use std::alloc::{GlobalAlloc, Layout};
use std::collections::VecDeque;
use std::io::Write;
use std::os::raw::{c_int, c_void};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use rayon::prelude::*;

const RECORD_BYTES: usize = 1000;
const STAGING_BYTES: usize = (2 << 20) + 8192;

// --------------------------------------------------------------------------- the allocator

/// jemalloc's own alignment guarantee for small sizes on x86_64 (tikv-jemallocator's MIN_ALIGN).
const MIN_ALIGN: usize = 16;

/// The global allocator, as tikv-jemallocator 0.5 writes it: the plain entry points
/// (`_rjem_malloc`, `_rjem_calloc`, `_rjem_realloc`) when the alignment is jemalloc's own, the
/// *allocx ones otherwise, and sized deallocation (`_rjem_sdallocx`) always. (Calling only the
/// *allocx ones would let the linker's --gc-sections drop `_rjem_malloc` and `_rjem_free`.)
struct Jem;

fn flags(align: usize, size: usize) -> c_int {
    if align <= MIN_ALIGN && align <= size {
        0
    } else {
        jemalloc_sys::MALLOCX_ALIGN(align)
    }
}

unsafe impl GlobalAlloc for Jem {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match flags(layout.align(), layout.size()) {
            0 => jemalloc_sys::malloc(layout.size()) as *mut u8,
            f => jemalloc_sys::mallocx(layout.size(), f) as *mut u8,
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        match flags(layout.align(), layout.size()) {
            0 => jemalloc_sys::calloc(1, layout.size()) as *mut u8,
            f => jemalloc_sys::mallocx(layout.size(), f | jemalloc_sys::MALLOCX_ZERO) as *mut u8,
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        jemalloc_sys::sdallocx(ptr as *mut c_void, layout.size(), flags(layout.align(), layout.size()))
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        match flags(layout.align(), new_size) {
            0 => jemalloc_sys::realloc(ptr as *mut c_void, new_size) as *mut u8,
            f => jemalloc_sys::rallocx(ptr as *mut c_void, new_size, f) as *mut u8,
        }
    }
}

#[global_allocator]
static GLOBAL: Jem = Jem;

// --------------------------------------------------------------------------- the allocation sites

/// One partition: `mb` MiB of u64 grown by push (RawVec's doubling: the last step reallocates to
/// exactly mb MiB when mb is a power of two).
#[inline(never)]
fn synthesize_partition(i: usize, mb: usize) -> Vec<u64> {
    let n = (mb << 20) / 8;
    let mut v = Vec::new();
    let mut x = i as u64 ^ 0x9e37_79b9_7f4a_7c15;
    for _ in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.push(x);
    }
    v
}

/// A synth thread hands its partition to the gpu thread: blocks while the one slot is taken.
#[inline(never)]
fn hand_off(tx: &mpsc::SyncSender<Vec<u64>>, p: Vec<u64>) {
    tx.send(p).unwrap(); // the wait (SEND_LINE)
}

/// The gpu thread's pinned staging buffer: STAGING_BYTES, kept.
#[inline(never)]
fn gpu_staging_buffer() -> Vec<u8> {
    vec![0x5a; STAGING_BYTES]
}

/// One request record: RECORD_BYTES, kept.
#[inline(never)]
fn make_request_record(i: usize) -> Box<[u8; RECORD_BYTES]> {
    let mut r = Box::new([0xa5u8; RECORD_BYTES]);
    r[0] = i as u8;
    r
}

// --------------------------------------------------------------------------- the daemon

struct Args {
    partitions: usize,
    hold: usize,
    mb: usize,
    records: usize,
    gpu_ms: usize,
    serve: usize,
    work: usize,
}

fn parse_args() -> Args {
    let mut a = Args { partitions: 16, hold: 3, mb: 16, records: 2000, gpu_ms: 0, serve: 0, work: 1 };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut it = argv.iter();
    while let Some(flag) = it.next() {
        let val = it.next().and_then(|v| v.parse::<usize>().ok());
        let slot = match flag.as_str() {
            "--partitions" => &mut a.partitions,
            "--hold" => &mut a.hold,
            "--mb" => &mut a.mb,
            "--records" => &mut a.records,
            "--gpu-ms" => &mut a.gpu_ms,
            "--serve" => &mut a.serve,
            "--work" => &mut a.work,
            _ => usage(flag),
        };
        *slot = val.unwrap_or_else(|| usage(flag));
    }
    if a.hold == 0 || a.hold > a.partitions || a.mb == 0 {
        usage("--hold must be 1..=partitions, --mb at least 1");
    }
    a
}

fn usage(what: &str) -> ! {
    eprintln!("rustd: bad argument {what}\nusage: rustd --partitions N --hold H [--mb 16] [--records 2000] [--gpu-ms 0] | --serve THREADS [--work 1]");
    std::process::exit(2)
}

/// Block SIGUSR1/SIGTERM/SIGINT in this thread (and so in every thread started after it): the
/// main thread takes them with sigwait.
fn block_signals() -> libc::sigset_t {
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGUSR1, libc::SIGTERM, libc::SIGINT] {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

fn wait_signal(set: &libc::sigset_t) -> c_int {
    let mut sig: c_int = 0;
    unsafe { libc::sigwait(set, &mut sig) };
    sig
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").unwrap();
    out.flush().unwrap();
}

struct GpuDone {
    received: usize,
    dropped: usize,
}

fn main() {
    let args = parse_args();
    let sigs = block_signals();
    if args.serve > 0 {
        serve::run(args.serve, args.work, &sigs);
    }
    let (mb, hold, records, gpu_ms) = (args.mb, args.hold, args.records, args.gpu_ms as u64);

    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(4)
        .thread_name(|i| format!("synth-{i}"))
        .build()
        .unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("tokio-rt")
        .enable_time()
        .build()
        .unwrap();

    // the gpu thread: keeps the last `hold` partitions; reports when the channel closes, then
    // holds them (and its staging buffer) until the process exits.
    let (tx, rx) = mpsc::sync_channel::<Vec<u64>>(1);
    let (done_tx, done_rx) = mpsc::channel::<GpuDone>();
    thread::Builder::new()
        .name("gpu".into())
        .spawn(move || {
            let mut live: VecDeque<Vec<u64>> = VecDeque::new();
            let mut staging: Option<Vec<u8>> = None;
            let (mut received, mut dropped) = (0, 0);
            while let Ok(p) = rx.recv() {
                if staging.is_none() {
                    staging = Some(gpu_staging_buffer());
                }
                received += 1;
                if gpu_ms > 0 {
                    thread::sleep(Duration::from_millis(gpu_ms)); // "prove" it
                }
                live.push_back(p);
                if live.len() > hold {
                    drop(live.pop_front());
                    dropped += 1;
                }
            }
            done_tx.send(GpuDone { received, dropped }).unwrap();
            loop {
                thread::park();
                let _ = (&live, &staging);
            }
        })
        .unwrap();

    say(&format!("ready {}", std::process::id()));
    wait_signal(&sigs);

    // the request path, concurrently with the partitions
    let requests = rt.spawn(async move {
        let mut kept = Vec::with_capacity(records);
        for i in 0..records {
            kept.push(make_request_record(i));
            if i % 500 == 499 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        kept
    });

    let n = args.partitions;
    pool.install(|| {
        (0..n)
            .into_par_iter()
            .map(|i| synthesize_partition(i, mb))
            .for_each_with(tx, |tx, p| hand_off(tx, p));
    });
    let gpu = done_rx.recv().unwrap();
    let kept = rt.block_on(requests).unwrap();
    assert_eq!((gpu.received, gpu.dropped), (n, n - hold));

    say(&format!(
        concat!(
            "done {{\"partition_bytes\":{},\"partitions\":{},\"partitions_live\":{},",
            "\"partitions_dropped\":{},\"records\":{},\"record_bytes\":{},\"staging_bytes\":{}}}"
        ),
        mb << 20,
        n,
        hold,
        gpu.dropped,
        kept.len(),
        RECORD_BYTES,
        STAGING_BYTES
    ));
    wait_signal(&sigs);
    drop(kept);
    std::process::exit(0);
}

// --------------------------------------------------------------------------- --serve: a daemon under load

/// `rustd --serve T [--work W]` (bench/inject_floor.py): a malloc-heavy multithreaded daemon
/// with its own counters, for overhead runs. T threads `worker-<i>` serve requests until SIGTERM
/// or SIGINT: each request allocates its body (256..2303 bytes) in `make_request`, digests it W
/// times over (the CPU work; at W = 1, the default, the allocator is ~3 % of the time), formats a
/// reply (`format!`), and replaces one slot of the thread's cache of CACHE_SLOTS entries with a
/// fresh `cache_entry` whose size the slot fixes (512 + (slot % 16) * 256 bytes): once every slot
/// has been filled the cache holds the same bytes in T * CACHE_SLOTS blocks, however many
/// requests came and went. Prints `ready <pid>`; on SIGUSR1 it prints
/// `stats {"requests":..,"cache_bytes":..,"cache_entries":..}`: requests served so far over all
/// threads, the cache's live bytes and blocks (all allocated in `cache_entry`: the truth for that
/// site's estimate).
mod serve {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    use std::thread;

    pub const CACHE_SLOTS: usize = 2048;

    pub fn entry_size(slot: usize) -> usize {
        512 + (slot % 16) * 256
    }

    #[repr(align(64))]
    struct Counter {
        requests: AtomicU64,
        cache_bytes: AtomicU64,
        cache_entries: AtomicU64,
    }

    #[inline(never)]
    fn make_request(seed: u64) -> Vec<u8> {
        let n = 256 + (seed as usize % 2048);
        let mut v = Vec::with_capacity(n);
        let mut x = seed | 1;
        for _ in 0..n {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            v.push(x as u8);
        }
        v
    }

    #[inline(never)]
    fn digest(body: &[u8], rounds: usize) -> u64 {
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        for r in 0..rounds {
            for &b in body {
                h = (h ^ b as u64 ^ r as u64).wrapping_mul(0x100_0000_01b3);
            }
        }
        h
    }

    #[inline(never)]
    fn cache_entry(slot: usize, h: u64) -> Box<[u8]> {
        let mut e = vec![0u8; entry_size(slot)].into_boxed_slice();
        e[0] = h as u8;
        e
    }

    fn worker(id: usize, work: usize, c: Arc<Counter>, stop: Arc<AtomicBool>) {
        let mut cache: Vec<Option<Box<[u8]>>> = (0..CACHE_SLOTS).map(|_| None).collect();
        let mut seed = (id as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let mut i = 0usize;
        let mut sink = 0u64;
        while !stop.load(Ordering::Relaxed) {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let body = make_request(seed >> 20);
            let h = digest(&body, work);
            let reply = format!("{id}:{i}:{h:016x}:{}", body.len());
            sink ^= reply.len() as u64;
            let slot = i % CACHE_SLOTS;
            if cache[slot].replace(cache_entry(slot, h)).is_none() {
                c.cache_entries.fetch_add(1, Ordering::Relaxed);
                c.cache_bytes.fetch_add(entry_size(slot) as u64, Ordering::Relaxed);
            }
            i += 1;
            c.requests.fetch_add(1, Ordering::Relaxed);
        }
        std::hint::black_box(sink);
    }

    pub fn run(threads: usize, work: usize, sigs: &libc::sigset_t) -> ! {
        let stop = Arc::new(AtomicBool::new(false));
        let counters: Vec<Arc<Counter>> = (0..threads)
            .map(|_| {
                Arc::new(Counter {
                    requests: AtomicU64::new(0),
                    cache_bytes: AtomicU64::new(0),
                    cache_entries: AtomicU64::new(0),
                })
            })
            .collect();
        let handles: Vec<_> = counters
            .iter()
            .enumerate()
            .map(|(id, c)| {
                let (c, stop) = (c.clone(), stop.clone());
                thread::Builder::new()
                    .name(format!("worker-{id}"))
                    .spawn(move || worker(id, work, c, stop))
                    .unwrap()
            })
            .collect();
        super::say(&format!("ready {}", std::process::id()));
        loop {
            let sig = super::wait_signal(sigs);
            let sum = |f: fn(&Counter) -> &AtomicU64| counters.iter().map(|c| f(c).load(Ordering::Relaxed)).sum::<u64>();
            if sig == libc::SIGUSR1 {
                super::say(&format!(
                    "stats {{\"requests\":{},\"cache_bytes\":{},\"cache_entries\":{}}}",
                    sum(|c| &c.requests),
                    sum(|c| &c.cache_bytes),
                    sum(|c| &c.cache_entries)
                ));
                continue;
            }
            stop.store(true, Ordering::Relaxed);
            for h in handles {
                h.join().unwrap();
            }
            std::process::exit(0);
        }
    }
}
