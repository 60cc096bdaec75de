//! Pins the Rust mirror to the C header, the source of truth.
//!
//! Compiles a probe against `runtime/include/tailscope/abi.h` with the system
//! C compiler (`$CC`, else `cc`), which prints the offset and size of every
//! field of every struct, every struct's size, and every `#define`; then
//! compares them with `offset_of!`/`size_of` and the Rust constants. Both
//! sides are also checked for being gap-free (the ABI pads explicitly), so a
//! field missing from this list on either side fails the test.

use std::collections::BTreeMap;
use std::mem::{offset_of, size_of};
use std::path::PathBuf;
use std::process::Command;

use tailscope_abi::*;

/// (struct, field, rust offset, rust size)
type Field = (&'static str, &'static str, usize, usize);

macro_rules! fields {
    ($($s:ident { $($f:ident),* $(,)? })*) => {{
        let mut v: Vec<Field> = Vec::new();
        $($(
            v.push((
                stringify!($s),
                // Raw identifiers (r#fn, r#type) name the C fields fn, type.
                stringify!($f).trim_start_matches("r#"),
                offset_of!($s, $f),
                {
                    fn size_of_field<T>(_: fn(&$s) -> &T) -> usize { size_of::<T>() }
                    size_of_field(|x: &$s| &x.$f)
                },
            ));
        )*)*
        v
    }};
}

fn all_fields() -> Vec<Field> {
    fields! {
        ts_kc_header { magic, abi_version, entry_size, entries, agent_pid, live, _pad0, collisions, _reserved }
        ts_kcounters {
            tid, seq, oncpu_ns, switch_in_ns, wait_since_ns, wait_state, last_blocked_ns, runnable_ns,
            blocked_ns, irq_ns, softirq_ns, runnable_count, blocked_count, irq_count,
            softirq_count, fault_user_count, fault_kernel_count, migrations, vol_switches,
            invol_switches, tgid, sampled_refs, _reserved,
        }
        ts_request_record {
            request_id, start_ns, latency_ns, tid, kind, flags, oncpu_ns, runnable_ns,
            blocked_ns, irq_ns, softirq_ns, runnable_count, blocked_count, irq_count,
            softirq_count, fault_user_count, fault_kernel_count, migrations, vol_switches,
            invol_switches, cpu,
        }
        ts_thread_slot {
            tid, state, gen, cur_request_id, cur_start_ns, cur_kind, cur_active, ring_head,
            dropped_ring_full, _pad_producer, ring_tail, _pad_consumer, ring, shadow, ev_head,
            ev_dropped, _pad_ev_producer, ev_tail, _pad_ev_consumer, events,
        }
        ts_frame { r#fn, site, id, sp, entry_ns }
        ts_shadow_stack { gen, depth, _pad0, truncated, resyncs, skipped, _pad1, frames }
        ts_event { ts_ns, object, arg, r#type, tid }
        ts_region_header {
            magic, abi_version, header_size, slot_size, max_slots, ring_capacity, record_size,
            pid, slots_used, sample_ppm_runtime, sample_ppm_agent, agent_pid, kinds_count,
            created_ns, slots_exhausted, kinds, shadow_depth, event_ring_capacity, features,
            ldb_flags, mutex_thresh_ns, burst_gate, sample_ppm_effective, agent_heartbeat_ns,
            _pad_drain, drain_futex, drain_waiting, _reserved,
        }
    }
}

fn struct_sizes() -> Vec<(&'static str, usize)> {
    vec![
        ("ts_kc_header", size_of::<ts_kc_header>()),
        ("ts_kcounters", size_of::<ts_kcounters>()),
        ("ts_request_record", size_of::<ts_request_record>()),
        ("ts_thread_slot", size_of::<ts_thread_slot>()),
        ("ts_region_header", size_of::<ts_region_header>()),
        ("ts_frame", size_of::<ts_frame>()),
        ("ts_shadow_stack", size_of::<ts_shadow_stack>()),
        ("ts_event", size_of::<ts_event>()),
    ]
}

/// Numeric #defines and their Rust values.
fn constants() -> Vec<(&'static str, u64)> {
    vec![
        ("TS_ABI_MAGIC", TS_ABI_MAGIC),
        ("TS_ABI_VERSION", TS_ABI_VERSION as u64),
        ("TS_KC_ENTRIES", TS_KC_ENTRIES as u64),
        ("TS_KC_PROBE", TS_KC_PROBE as u64),
        ("TS_KC_ENTRY_SIZE", TS_KC_ENTRY_SIZE as u64),
        ("TS_WAIT_NONE", TS_WAIT_NONE as u64),
        ("TS_WAIT_RUNNABLE", TS_WAIT_RUNNABLE as u64),
        ("TS_WAIT_BLOCKED", TS_WAIT_BLOCKED as u64),
        ("TS_MAX_SLOTS", TS_MAX_SLOTS as u64),
        ("TS_RING_CAPACITY", TS_RING_CAPACITY as u64),
        ("TS_RING_WAKE_FILL", TS_RING_WAKE_FILL as u64),
        ("TS_MAX_KINDS", TS_MAX_KINDS as u64),
        ("TS_KIND_NAME_LEN", TS_KIND_NAME_LEN as u64),
        ("TS_PPM", TS_PPM as u64),
        ("TS_DEFAULT_SAMPLE_PPM", TS_DEFAULT_SAMPLE_PPM as u64),
        ("TS_REC_SAMPLED", TS_REC_SAMPLED as u64),
        ("TS_REC_INFERRED", TS_REC_INFERRED as u64),
        ("TS_REC_COUNTERS", TS_REC_COUNTERS as u64),
        ("TS_REC_TORN", TS_REC_TORN as u64),
        ("TS_SLOT_FREE", TS_SLOT_FREE as u64),
        ("TS_SLOT_LIVE", TS_SLOT_LIVE as u64),
        ("TS_SLOT_EXITED", TS_SLOT_EXITED as u64),
        ("TS_SHADOW_DEPTH", TS_SHADOW_DEPTH as u64),
        ("TS_EVENT_RING_CAPACITY", TS_EVENT_RING_CAPACITY as u64),
        ("TS_MUTEX_THRESH_NS", TS_MUTEX_THRESH_NS),
        ("TS_FEAT_FN_HOOKS", TS_FEAT_FN_HOOKS as u64),
        ("TS_FEAT_LOCK_SHIM", TS_FEAT_LOCK_SHIM as u64),
        ("TS_FEAT_FN_CLOCK", TS_FEAT_FN_CLOCK as u64),
        ("TS_FEAT_SNAP_GUARD", TS_FEAT_SNAP_GUARD as u64),
        ("TS_LDB_LOCKS", TS_LDB_LOCKS as u64),
        ("TS_LDB_REQUESTS", TS_LDB_REQUESTS as u64),
        ("TS_LDB_SLOTS", TS_LDB_SLOTS as u64),
        ("TS_AGENT_STALE_NS", TS_AGENT_STALE_NS),
        ("TS_BURST_CLOSED", TS_BURST_CLOSED as u64),
        ("TS_BURST_DETACHED", TS_BURST_DETACHED as u64),
        ("TS_BURST_WINDOW_SHIFT", TS_BURST_WINDOW_SHIFT as u64),
        ("TS_EV_FUNCTION", TS_EV_FUNCTION as u64),
        ("TS_EV_MUTEX_WAIT", TS_EV_MUTEX_WAIT as u64),
        ("TS_EV_MUTEX_LOCK", TS_EV_MUTEX_LOCK as u64),
        ("TS_EV_MUTEX_UNLOCK", TS_EV_MUTEX_UNLOCK as u64),
        ("TS_EV_REQ_START", TS_EV_REQ_START as u64),
        ("TS_EV_REQ_BLOCK", TS_EV_REQ_BLOCK as u64),
        ("TS_EV_REQ_END", TS_EV_REQ_END as u64),
        ("TS_EV_REQ_END_ALL", TS_EV_REQ_END_ALL as u64),
    ]
}

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn probe_source() -> String {
    let mut c = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include \"tailscope/abi.h\"\n\
         #define F(S, f) printf(\"field %s.%s %zu %zu\\n\", #S, #f, offsetof(struct S, f), sizeof(((struct S *)0)->f))\n\
         int main(void) {\n",
    );
    for (s, f, _, _) in all_fields() {
        c += &format!("  F({s}, {f});\n");
    }
    for (s, _) in struct_sizes() {
        c += &format!("  printf(\"size {s} %zu\\n\", sizeof(struct {s}));\n");
    }
    for (k, _) in constants() {
        c += &format!("  printf(\"const {k} %llu\\n\", (unsigned long long)({k}));\n");
    }
    c += "  printf(\"str TS_KC_PIN_DIR %s\\n\", TS_KC_PIN_DIR);\n";
    c += "  printf(\"str TS_KC_PIN_PREFIX %s\\n\", TS_KC_PIN_PREFIX);\n";
    c += "  printf(\"str TS_REGION_PATH_FMT \" TS_REGION_PATH_FMT \"\\n\", 1234);\n";
    c += "  return 0;\n}\n";
    c
}

fn run_probe() -> String {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("abi_layout_probe");
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("probe.c");
    let exe = dir.join("probe");
    std::fs::write(&src, probe_source()).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let inc = repo_root().join("runtime/include");
    let out = Command::new(&cc)
        .arg("-std=c11")
        .arg("-Wall")
        .arg("-Werror")
        .arg("-I")
        .arg(&inc)
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("cannot run C compiler {cc:?}: {e}"));
    assert!(
        out.status.success(),
        "C probe failed to compile:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(&exe).output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

/// Fields sorted by offset must tile the struct: no gaps, no overlap.
fn assert_gap_free(what: &str, fields: &[(usize, usize, String)], total: usize) {
    let mut sorted = fields.to_vec();
    sorted.sort();
    let mut at = 0;
    for (off, size, name) in &sorted {
        assert_eq!(*off, at, "{what}: gap or overlap before {name}");
        at = off + size;
    }
    assert_eq!(at, total, "{what}: fields do not cover the struct");
}

#[test]
fn rust_mirror_matches_c_header() {
    let out = run_probe();
    let mut c_fields: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let mut c_sizes = BTreeMap::new();
    let mut c_consts = BTreeMap::new();
    let mut c_strs = BTreeMap::new();
    for line in out.lines() {
        let p: Vec<&str> = line.splitn(4, ' ').collect();
        match p[0] {
            "field" => {
                c_fields.insert(
                    p[1].to_string(),
                    (p[2].parse().unwrap(), p[3].parse().unwrap()),
                );
            }
            "size" => {
                c_sizes.insert(p[1].to_string(), p[2].parse::<usize>().unwrap());
            }
            "const" => {
                c_consts.insert(p[1].to_string(), p[2].parse::<u64>().unwrap());
            }
            "str" => {
                c_strs.insert(
                    p[1].to_string(),
                    line.splitn(3, ' ').nth(2).unwrap().to_string(),
                );
            }
            _ => panic!("unexpected probe line {line}"),
        }
    }

    for (s, f, off, size) in all_fields() {
        let key = format!("{s}.{f}");
        let (c_off, c_size) = c_fields[&key];
        assert_eq!(
            (off, size),
            (c_off, c_size),
            "{key}: (offset, size) Rust vs C"
        );
    }
    for (s, size) in struct_sizes() {
        assert_eq!(size, c_sizes[s], "sizeof(struct {s}) Rust vs C");
        let rust: Vec<_> = all_fields()
            .into_iter()
            .filter(|f| f.0 == s)
            .map(|(_, f, o, z)| (o, z, f.to_string()))
            .collect();
        assert_gap_free(&format!("Rust {s}"), &rust, size);
        let c: Vec<_> = c_fields
            .iter()
            .filter(|(k, _)| k.starts_with(&format!("{s}.")))
            .map(|(k, (o, z))| (*o, *z, k.clone()))
            .collect();
        assert_gap_free(&format!("C {s}"), &c, c_sizes[s]);
    }
    for (k, v) in constants() {
        assert_eq!(v, c_consts[k], "#define {k} Rust vs C");
    }
    assert_eq!(c_strs["TS_KC_PIN_DIR"], TS_KC_PIN_DIR);
    assert_eq!(c_strs["TS_KC_PIN_PREFIX"], TS_KC_PIN_PREFIX);
    assert_eq!(
        c_strs["TS_REGION_PATH_FMT"],
        format!("{TS_REGION_PATH_PREFIX}1234")
    );
    // The derived sizes the agent uses.
    assert_eq!(RECORD_SIZE, c_sizes["ts_request_record"]);
    assert_eq!(SLOT_SIZE, c_sizes["ts_thread_slot"]);
    assert_eq!(REGION_HEADER_SIZE, c_sizes["ts_region_header"]);
}

/// Guards the guard: a #define that the header adds must be listed here.
#[test]
fn every_define_is_checked() {
    let header =
        std::fs::read_to_string(repo_root().join("runtime/include/tailscope/abi.h")).unwrap();
    let known: Vec<&str> = constants().iter().map(|c| c.0).collect();
    let strings = [
        "TS_KC_PIN_DIR",
        "TS_KC_PIN_PREFIX",
        "TS_REGION_PATH_FMT",
        "TAILSCOPE_ABI_H",
    ];
    for line in header.lines() {
        if let Some(rest) = line.trim_start().strip_prefix("#define ") {
            let name = rest.split_whitespace().next().unwrap();
            assert!(
                known.contains(&name) || strings.contains(&name),
                "abi.h defines {name}, which tests/layout.rs does not pin"
            );
        }
    }
}
