//! meshca's memory allocator: jemalloc, with freed memory handed back to the system within about a
//! second.
//!
//! An issuance wave or a push to every stream allocates and frees hundreds of megabytes on several
//! threads at once. glibc's malloc did that slowly (a quarter of the daemon's CPU during a 100,000-stream
//! rotation went to `_int_malloc`, `unlink_chunk` and arena locks) and kept each thread arena's high-water
//! mark afterwards. jemalloc's thread caches make the same work cheap, and its decay returns what a wave
//! freed: BENCHMARKS.md has both measurements.
//!
//! Its options are compiled in (`JEMALLOC_SYS_WITH_MALLOC_CONF` in `.cargo/config.toml`); the operator can
//! override them with the `_RJEM_MALLOC_CONF` environment variable, in the same syntax (`man jemalloc`):
//! - `background_thread:true`: a thread of jemalloc's own returns unused pages to the system, instead of
//!   whichever thread happens to allocate next (an idle daemon would otherwise never give them back);
//! - `dirty_decay_ms:1000`: freed pages are handed back after about a second, not ten, so the memory of
//!   a finished wave leaves the resident set soon after;
//! - `muzzy_decay_ms:0`: and released at once once handed back;
//! - `narenas:2`: two arenas, not four per core. Each arena keeps partly used pages of every size class
//!   of its own; at 100,000 idle SDS streams eight arenas (this 2-core machine's default) held about
//!   400 bytes per stream more than two (BENCHMARKS.md), at no measurable CPU cost. Threads share an
//!   arena only past their thread caches. On a host with many cores serving many streams,
//!   `_RJEM_MALLOC_CONF=narenas:<4 × cores>` restores the default;
//! - `tcache_max:4096`: a thread keeps freed blocks of up to 4 KiB for its next allocations, not up to
//!   32 KiB. The larger blocks are connections' read buffers, which grow while a first request of
//!   60 KB arrives and are freed when it is read: each thread that ever read one kept up to twenty of
//!   each size for as long as it lived, idle or not. At 10,000 idle SDS streams that was about 600
//!   bytes per stream, at 100,000 about 250, at no measurable CPU cost (BENCHMARKS.md).

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[cfg(test)]
mod tests {
    /// The options this module's documentation describes, as `.cargo/config.toml` compiles them in.
    const OPTIONS: [&str; 5] = [
        "background_thread:true",
        "dirty_decay_ms:1000",
        "muzzy_decay_ms:0",
        "narenas:2",
        "tcache_max:4096",
    ];

    #[test]
    fn jemalloc_takes_every_compiled_in_option() {
        // jemalloc says which options it set as it starts when asked to (`confirm_conf`), and calls a
        // misspelled or unknown one an invalid pair instead: start this test binary again, listing
        // its tests only, and read what it said.
        let exe = std::env::current_exe().expect("the test binary has a path");
        let out = std::process::Command::new(exe)
            .arg("--list")
            .env("_RJEM_MALLOC_CONF", "confirm_conf:true")
            .output()
            .expect("the test binary starts again");
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "the test binary failed: {said}");
        for option in OPTIONS {
            assert!(
                said.lines()
                    .any(|l| l.trim_end() == format!("<jemalloc>: -- Set conf value: {option}")),
                "jemalloc did not set {option}: {said}"
            );
        }
        assert!(
            !said.contains("Invalid conf"),
            "jemalloc refused an option: {said}"
        );
    }

    #[test]
    fn jemalloc_runs_the_background_thread_the_options_ask_for() {
        // Allocating starts jemalloc; the background thread then shows among the process's threads.
        let kept: Vec<Vec<u8>> = (0..64).map(|i| vec![i as u8; 1 << 16]).collect();
        drop(kept);
        let task = std::path::Path::new("/proc/self/task");
        if !task.exists() {
            return;
        }
        let names = || -> Vec<String> {
            std::fs::read_dir(task)
                .expect("/proc/self/task lists the threads")
                .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
                .collect()
        };
        // jemalloc starts the thread on its own schedule: wait for it to appear (it did within
        // milliseconds on every run; the bound only keeps a broken build from hanging the test).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut seen = names();
        while !seen.iter().any(|n| n.trim() == "jemalloc_bg_thd")
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(5));
            seen = names();
        }
        assert!(
            seen.iter().any(|n| n.trim() == "jemalloc_bg_thd"),
            "no jemalloc background thread among {seen:?}"
        );
    }
}
