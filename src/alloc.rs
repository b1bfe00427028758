//! The `jemalloc` feature (Linux): jemalloc allocates for the whole process.
//!
//! A training step on a GPU is bound by host time: building MLX's graph, the fusion pass and
//! MLX's evaluation allocate and free thousands of small objects per step, in Rust and in MLX's
//! C++. jemalloc's symbols are unprefixed, so the `malloc` and `free` that `libmlx.so` calls
//! resolve to it as well as Rust's allocations (through [`GLOBAL`]). The measurements behind the
//! feature, and why it is not on by default, are in docs/performance.md ("Allocator").

/// Rust's allocations go to jemalloc; this also links jemalloc's `malloc` into the binary.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// A C string pointer that may sit in a `static`: it points at a literal and is never written.
#[repr(transparent)]
struct ConfString(*const std::ffi::c_char);

// SAFETY: the pointer refers to a `'static` literal that nothing writes.
unsafe impl Sync for ConfString {}

/// jemalloc's options (its weak `malloc_conf`, read at its first allocation; `MALLOC_CONF` in
/// the environment still overrides them). Freed pages stay with the process instead of being
/// returned to the system after 10 s: on the CPU, MLX's buffers come from `malloc`, and with the
/// default decay a CPU Transformer step paid page faults for returned pages (about 1.25x slower
/// than glibc; with these options level with it).
#[used]
#[export_name = "malloc_conf"]
static MALLOC_CONF: ConfString = ConfString(c"dirty_decay_ms:-1,muzzy_decay_ms:-1".as_ptr());
