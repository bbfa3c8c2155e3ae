//! The CPU time a thread used, for tests that tell a sleeping waiter from a polling one.

/// utime + stime of the calling thread, in clock ticks.
pub fn thread_cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").expect("thread stat");
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    // After the command name: state is field 3, utime 14, stime 15 (1-based).
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}
