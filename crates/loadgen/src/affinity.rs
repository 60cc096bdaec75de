//! Pinning the generator to one CPU (`--cpu`), so that on a two-core box
//! the server and the load never share a core and the generator's own
//! scheduling delay stays out of the measured latency.

/// Pin the calling thread to `cpu`.
pub fn pin_current_thread(cpu: usize) -> Result<(), String> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(format!("--cpu {cpu} is out of range"));
    }
    // SAFETY: cpu_set_t is plain data; CPU_SET stays in bounds (checked
    // above); sched_setaffinity only reads the set we pass.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc != 0 {
        return Err(format!(
            "cannot pin to CPU {cpu}: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}
