// Test target for DWARF unwinding of Rust release code (tests/test_unwind_bpf.py).
// Built `rustc -C opt-level=2 -g` (std only, no forced frame pointers).
//
// After a line on stdin, threads "vec-maker-1" and "vec-maker-2" each allocate Vecs through
// rust_outer -> rust_middle -> rust_inner (never inlined) and keep them; then "done" is
// printed and the program lingers until stdin closes.
use std::hint::black_box;
use std::io::BufRead;
use std::sync::Mutex;
use std::thread;

static KEPT: Mutex<Vec<Vec<u64>>> = Mutex::new(Vec::new());

#[inline(never)]
fn rust_inner(n: usize) -> Vec<u64> {
    let mut v: Vec<u64> = Vec::with_capacity(n); // R3
    v.push(n as u64);
    black_box(v)
}

#[inline(never)]
fn rust_middle(n: usize) -> Vec<u64> {
    let v = rust_inner(n + 1); // R2
    black_box(v)
}

#[inline(never)]
fn rust_outer(n: usize) {
    for _ in 0..5 {
        let v = rust_middle(black_box(n)); // R1
        KEPT.lock().unwrap().push(v);
    }
}

fn main() {
    let stdin = std::io::stdin();
    let mut line = String::new();
    println!("ready {}", std::process::id());
    stdin.lock().read_line(&mut line).unwrap();
    let mut handles = Vec::new();
    for i in 1..=2 {
        let h = thread::Builder::new()
            .name(format!("vec-maker-{}", i))
            .spawn(move || rust_outer(1000 * i)) // R0
            .unwrap();
        handles.push(h);
    }
    for h in handles {
        h.join().unwrap();
    }
    println!("done");
    for l in stdin.lock().lines() {
        if l.is_err() {
            break;
        }
    }
}
