//! The `requests` table: buffered rows → Parquet row groups → rotated files.
//!
//! Rows are buffered column-wise; a row group is written every
//! [`WriterPolicy::row_group_rows`] rows, and the file is closed (footer
//! written, renamed into place) every [`WriterPolicy::rotate_rows`] rows or
//! [`WriterPolicy::rotate_after`]. A Parquet file is unreadable until its
//! footer exists, so rotation — not row-group size — bounds what a crash
//! can lose; the file being written is hidden (`.part-N.parquet.inprogress`)
//! so that readers of the directory never see a half-written file.
//!
//! Encoding runs on a writer thread ([`RequestWriter`] hands it full row
//! groups over a bounded channel), so the drain loop never stalls on zstd.
//!
//! Size on disk (≈ 20 B/request on synthetic data, see the
//! `bytes_per_request` test; ≈ 6 B on a real memcached recording):
//! DELTA_BINARY_PACKED, uncompressed, for the columns that change by small
//! steps (`request_id`, `start_ns`, `latency_ns`, `on_cpu_ns`), zstd over
//! PLAIN for the rest (mostly zero or slowly changing). Chosen per column by
//! CPU per row at about the same size (`encoding_bench`).
//!
//! The row groups go through the parquet crate's typed column writers
//! (`SerializedFileWriter`), straight from the column buffers the drain
//! loop fills: no Arrow arrays are built (the Arrow path cost ~200 ns/row
//! whatever the encoding). The files are the ones the Arrow writer made:
//! the same Parquet schema (converted from [`requests_schema`]), the same
//! encodings, and the `ARROW:schema` key, plus `tailscope.schema_version`.
//! Buffers come back from the writer thread to be refilled, so their pages
//! stay mapped (fresh 8 MB buffers cost a page fault per 4 KiB).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[cfg(test)]
use arrow_array::RecordBatch;
use arrow_schema::{DataType, Field, Schema, SchemaRef};
#[cfg(test)]
use parquet::arrow::ArrowWriter;
use parquet::arrow::{add_encoded_arrow_schema_to_metadata, ArrowSchemaConverter};
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::data_type::{BoolType, ByteArray, ByteArrayType, Int32Type, Int64Type};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::{EnabledStatistics, WriterProperties, WriterVersion};
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::types::TypePtr;
use tailscope_abi::{
    ts_request_record, TS_REC_COUNTERS, TS_REC_INFERRED, TS_REC_SAMPLED, TS_REC_TORN,
};

use crate::error::{exit, AgentError, Result};

/// The columns, in order: (name, schema/recording.json type).
pub const COLUMNS: &[(&str, &str)] = &[
    ("request_id", "uint64"),
    ("pid", "uint32"),
    ("tid", "uint32"),
    ("kind", "string"),
    ("start_ns", "uint64"),
    ("latency_ns", "uint64"),
    ("on_cpu_ns", "uint64"),
    ("runnable_wait_ns", "uint64"),
    ("blocked_wait_ns", "uint64"),
    ("irq_ns", "uint64"),
    ("softirq_ns", "uint64"),
    ("runnable_wait_count", "uint32"),
    ("blocked_wait_count", "uint32"),
    ("irq_count", "uint32"),
    ("softirq_count", "uint32"),
    ("fault_user_count", "uint32"),
    ("fault_kernel_count", "uint32"),
    ("migration_count", "uint32"),
    ("voluntary_switch_count", "uint32"),
    ("involuntary_switch_count", "uint32"),
    ("cpu", "uint32"),
    ("sampled", "bool"),
    ("inferred", "bool"),
    ("counters_valid", "bool"),
];

pub fn arrow_type(ty: &str) -> Option<DataType> {
    Some(match ty {
        "uint64" => DataType::UInt64,
        "uint32" => DataType::UInt32,
        "string" => DataType::Utf8,
        "bool" => DataType::Boolean,
        _ => return None,
    })
}

pub fn requests_schema() -> SchemaRef {
    let fields: Vec<Field> = COLUMNS
        .iter()
        .map(|(name, ty)| Field::new(*name, arrow_type(ty).expect("known type"), false))
        .collect();
    Arc::new(Schema::new(fields))
}

#[derive(Debug, Clone, Copy)]
pub struct WriterPolicy {
    pub row_group_rows: usize,
    pub rotate_rows: u64,
    pub rotate_after: Duration,
}

impl Default for WriterPolicy {
    fn default() -> Self {
        WriterPolicy {
            row_group_rows: 65_536,
            rotate_rows: 1_000_000,
            rotate_after: Duration::from_secs(60),
        }
    }
}

/// Columns whose values change from row to row by amounts that bit-pack
/// well: DELTA_BINARY_PACKED, not compressed. On a real recording
/// (memcached-marked at 100%) each of these cost 6-13 ns/row so and 15-26
/// ns/row as PLAIN + zstd, at the same size (`encoding_bench`).
const DELTA_COLUMNS: &[&str] = &["request_id", "start_ns", "latency_ns", "on_cpu_ns"];

#[cfg(test)]
fn properties() -> WriterProperties {
    properties_builder().build()
}

fn properties_builder() -> parquet::file::properties::WriterPropertiesBuilder {
    let mut b = WriterProperties::builder()
        .set_writer_version(WriterVersion::PARQUET_2_0)
        // Everything else is PLAIN + zstd level 1: the counters are mostly
        // zero or small and the pid/tid/cpu/kind columns change rarely, so
        // zstd squeezes them to ~0.01 B/row at 2-3 ns/row, where delta
        // packing or a dictionary cost 6-8 ns/row (encoding_bench). Level 1:
        // at level 3 zstd clears ~0.5 MB of match tables for every page.
        .set_compression(Compression::ZSTD(
            ZstdLevel::try_new(1).expect("valid level"),
        ))
        .set_dictionary_enabled(false)
        // Min/max statistics cost a comparison per value and column (12%
        // of the agent's CPU at 100% sampling); only the time column keeps
        // them, for readers that skip row groups by time.
        .set_statistics_enabled(EnabledStatistics::None)
        .set_column_statistics_enabled("start_ns".into(), EnabledStatistics::Chunk)
        .set_created_by(format!("tailscope-agent {}", env!("CARGO_PKG_VERSION")));
    for col in DELTA_COLUMNS {
        b = b
            .set_column_encoding((*col).into(), Encoding::DELTA_BINARY_PACKED)
            .set_column_compression((*col).into(), Compression::UNCOMPRESSED);
    }
    // The other integer columns must say PLAIN too: without a dictionary
    // a version-2 writer falls back to DELTA_BINARY_PACKED for every
    // integer column, and until session 10 it did, so the "PLAIN + zstd"
    // columns were delta + zstd, ~2-3x the CPU per row (encoding_bench).
    for (col, ty) in COLUMNS {
        if ty.starts_with("uint") && !DELTA_COLUMNS.contains(col) {
            b = b.set_column_encoding((*col).into(), Encoding::PLAIN);
        }
    }
    // Strings must say PLAIN: without a dictionary a version-2 writer falls
    // back to DELTA_BYTE_ARRAY, which pyarrow cannot read as a dictionary
    // (the Python reader asks for `kind` as one). The flags keep the
    // version-2 default, RLE (bit-packed runs).
    b.set_column_encoding("kind".into(), Encoding::PLAIN)
}

/// Session 8's encodings, kept for `encoding_bench`'s comparison.
#[cfg(test)]
fn properties_session8() -> WriterProperties {
    let mut b = WriterProperties::builder()
        .set_writer_version(WriterVersion::PARQUET_2_0)
        .set_compression(Compression::ZSTD(
            ZstdLevel::try_new(1).expect("valid level"),
        ))
        .set_dictionary_enabled(false)
        .set_statistics_enabled(EnabledStatistics::None)
        .set_column_statistics_enabled("start_ns".into(), EnabledStatistics::Chunk);
    for col in ["kind", "pid", "tid", "cpu"] {
        b = b.set_column_dictionary_enabled(col.into(), true);
    }
    for col in ["request_id", "start_ns"] {
        b = b.set_column_encoding(col.into(), Encoding::DELTA_BINARY_PACKED);
    }
    b.build()
}

/// Where each column (in [`COLUMNS`] order) comes from in [`Buffers`].
#[derive(Clone, Copy)]
enum Src {
    I64(usize),
    I32(usize),
    Kind,
    Flag(usize),
}

const SOURCES: [Src; 24] = [
    Src::I64(0), // request_id
    Src::I32(0), // pid
    Src::I32(1), // tid
    Src::Kind,
    Src::I64(1),  // start_ns
    Src::I64(2),  // latency_ns
    Src::I64(3),  // on_cpu_ns
    Src::I64(4),  // runnable_wait_ns
    Src::I64(5),  // blocked_wait_ns
    Src::I64(6),  // irq_ns
    Src::I64(7),  // softirq_ns
    Src::I32(2),  // runnable_wait_count
    Src::I32(3),  // blocked_wait_count
    Src::I32(4),  // irq_count
    Src::I32(5),  // softirq_count
    Src::I32(6),  // fault_user_count
    Src::I32(7),  // fault_kernel_count
    Src::I32(8),  // migration_count
    Src::I32(9),  // voluntary_switch_count
    Src::I32(10), // involuntary_switch_count
    Src::I32(11), // cpu
    Src::Flag(0), // sampled
    Src::Flag(1), // inferred
    Src::Flag(2), // counters_valid
];

const _: () = assert!(SOURCES.len() == COLUMNS.len());

/// Column buffers for one row group, in the physical types the column
/// writers take: the unsigned columns are stored as their bit patterns
/// (Parquet INT64/INT32 with an unsigned logical type, as the Arrow writer
/// stores UInt64/UInt32).
#[derive(Default)]
struct Buffers {
    i64s: [Vec<i64>; 8],
    i32s: [Vec<i32>; 12],
    /// Per row: an index into `kinds`, the distinct kinds of this group.
    kind: Vec<u32>,
    kinds: Vec<String>,
    flags: [Vec<bool>; 3],
}

impl Buffers {
    /// Room for a whole row group, so that filling one never reallocates
    /// (and copies) the columns. Large allocations are mapped lazily: a
    /// slow recording touches only the pages its rows use.
    fn with_capacity(rows: usize) -> Buffers {
        Buffers {
            i64s: std::array::from_fn(|_| Vec::with_capacity(rows)),
            i32s: std::array::from_fn(|_| Vec::with_capacity(rows)),
            kind: Vec::with_capacity(rows),
            kinds: Vec::new(),
            flags: std::array::from_fn(|_| Vec::with_capacity(rows)),
        }
    }

    fn len(&self) -> usize {
        self.kind.len()
    }

    /// Empties the buffers, keeping their memory.
    fn clear(&mut self) {
        self.i64s.iter_mut().for_each(Vec::clear);
        self.i32s.iter_mut().for_each(Vec::clear);
        self.flags.iter_mut().for_each(Vec::clear);
        self.kind.clear();
        self.kinds.clear();
    }

    fn kind_index(&mut self, kind: &str) -> u32 {
        // Requests of one kind come in runs: the last row's kind first.
        if let Some(&last) = self.kind.last() {
            if self.kinds[last as usize] == kind {
                return last;
            }
        }
        match self.kinds.iter().position(|k| k == kind) {
            Some(i) => i as u32,
            None => {
                self.kinds.push(kind.to_owned());
                (self.kinds.len() - 1) as u32
            }
        }
    }

    #[inline]
    fn push(&mut self, pid: u32, kind: &str, r: &ts_request_record) {
        let i64s = [
            r.request_id,
            r.start_ns,
            r.latency_ns,
            r.oncpu_ns,
            r.runnable_ns,
            r.blocked_ns,
            r.irq_ns,
            r.softirq_ns,
        ];
        for (col, v) in self.i64s.iter_mut().zip(i64s) {
            col.push(v as i64);
        }
        let i32s = [
            pid,
            r.tid,
            r.runnable_count,
            r.blocked_count,
            r.irq_count,
            r.softirq_count,
            r.fault_user_count,
            r.fault_kernel_count,
            r.migrations,
            r.vol_switches,
            r.invol_switches,
            r.cpu,
        ];
        for (col, v) in self.i32s.iter_mut().zip(i32s) {
            col.push(v as i32);
        }
        let k = self.kind_index(kind);
        self.kind.push(k);
        let counters_valid = r.flags & TS_REC_COUNTERS != 0 && r.flags & TS_REC_TORN == 0;
        self.flags[0].push(r.flags & TS_REC_SAMPLED != 0);
        self.flags[1].push(r.flags & TS_REC_INFERRED != 0);
        self.flags[2].push(counters_valid);
    }
}

/// The Parquet schema the Arrow writer derives from [`requests_schema`].
fn parquet_schema() -> Result<TypePtr> {
    ArrowSchemaConverter::new()
        .convert(&requests_schema())
        .map(|d| d.root_schema_ptr())
        .map_err(|e| AgentError::internal(format!("the requests schema: {e}")))
}

/// [`properties`] plus the key/value metadata every file carries: the
/// Arrow schema (readers that map Parquet to Arrow use it) and the
/// recording schema's version.
fn file_properties() -> Arc<WriterProperties> {
    let kv = KeyValue::new(
        SCHEMA_VERSION_KEY.to_owned(),
        crate::schema::schema_version().to_string(),
    );
    let mut props = properties_builder()
        .set_key_value_metadata(Some(vec![kv]))
        .build();
    add_encoded_arrow_schema_to_metadata(&requests_schema(), &mut props);
    Arc::new(props)
}

/// The key/value metadata key that holds `schema/recording.json`'s version.
pub const SCHEMA_VERSION_KEY: &str = "tailscope.schema_version";

struct OpenFile {
    writer: SerializedFileWriter<File>,
    tmp_path: PathBuf,
    final_path: PathBuf,
    rows: u64,
}

/// What a finished writer produced.
#[derive(Debug, Clone, Default)]
pub struct WriterSummary {
    pub rows: u64,
    pub bytes: u64,
    /// Paths relative to the recording directory.
    pub files: Vec<String>,
}

/// What the writer thread is asked to do.
enum Cmd {
    /// Write these rows as a row group (and rotate by rows if due).
    Rows(Box<Buffers>),
    /// Close the open file (time-based rotation).
    Rotate,
}

/// The front the drain loop pushes rows into. Parquet encoding (zstd, a
/// few tens of ms per 64 Ki-row group on this machine) runs on a writer
/// thread, so that the drain loop never stalls long enough for a target's
/// 512-record ring to fill: at 40 k req/s and 100% sampling it did, once
/// per row group, before the encoding moved off the loop.
pub struct RequestWriter {
    policy: WriterPolicy,
    buffers: Buffers,
    rows: u64,
    /// When the first row not yet in a closed file arrived.
    window_start: Option<Instant>,
    tx: Option<std::sync::mpsc::SyncSender<Cmd>>,
    worker: Option<std::thread::JoinHandle<Result<WriterSummary>>>,
    bytes: Arc<std::sync::atomic::AtomicU64>,
    /// Buffers the writer thread has written, ready to be filled again.
    spare: std::sync::mpsc::Receiver<Box<Buffers>>,
}

/// The writer thread's side: files on disk.
struct FileSink {
    dir: PathBuf,
    requests_dir: PathBuf,
    policy: WriterPolicy,
    file: Option<OpenFile>,
    next_index: u32,
    summary: WriterSummary,
    /// Closed files plus what the open one has flushed, for the progress line.
    bytes: Arc<std::sync::atomic::AtomicU64>,
    parquet_schema: TypePtr,
    props: Arc<WriterProperties>,
    /// Written buffers go back to the drain loop, to be filled again.
    spare: std::sync::mpsc::Sender<Box<Buffers>>,
    /// The `kind` column's values (reused between row groups).
    kind_values: Vec<ByteArray>,
}

fn io_err(what: &str, path: &Path, e: impl std::fmt::Display) -> AgentError {
    AgentError::new(exit::INTERNAL, format!("{what} {}: {e}", path.display()))
}

/// Row groups that may wait for the writer thread before push blocks.
const PENDING_ROW_GROUPS: usize = 4;

impl RequestWriter {
    /// `dir` is the recording directory; files go to `dir/requests/`.
    pub fn new(dir: &Path, policy: WriterPolicy) -> Result<Self> {
        let requests_dir = dir.join("requests");
        std::fs::create_dir_all(&requests_dir).map_err(|e| {
            AgentError::new(
                exit::OUTPUT,
                format!("cannot create {}: {e}", requests_dir.display()),
            )
        })?;
        let bytes = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (spare_tx, spare) = std::sync::mpsc::channel();
        let mut sink = FileSink {
            dir: dir.to_path_buf(),
            requests_dir,
            policy,
            file: None,
            next_index: 0,
            summary: WriterSummary::default(),
            bytes: bytes.clone(),
            parquet_schema: parquet_schema()?,
            props: file_properties(),
            spare: spare_tx,
            kind_values: Vec::new(),
        };
        let (tx, rx) = std::sync::mpsc::sync_channel::<Cmd>(PENDING_ROW_GROUPS);
        let worker = std::thread::Builder::new()
            .name("ts-writer".into())
            .spawn(move || {
                // Encoding is bulk work (tens of ms per row group) that can
                // wait: at nice 19 it takes only CPU time the target and its
                // clients leave, instead of holding a server's CPU for a
                // whole time slice (that put ms into the target's p99).
                // SAFETY: plain syscalls on this thread.
                unsafe {
                    libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19);
                }
                for cmd in rx {
                    match cmd {
                        Cmd::Rows(b) => sink.write_rows(b)?,
                        Cmd::Rotate => sink.close_file()?,
                    }
                }
                sink.finish()
            })
            .map_err(|e| AgentError::internal(format!("cannot start the writer thread: {e}")))?;
        Ok(RequestWriter {
            policy,
            buffers: Buffers::with_capacity(policy.row_group_rows),
            rows: 0,
            window_start: None,
            tx: Some(tx),
            worker: Some(worker),
            bytes,
            spare,
        })
    }

    /// Empty buffers for the next row group: ones the writer thread has
    /// finished with, or new ones.
    fn fresh_buffers(&mut self) -> Buffers {
        match self.spare.try_recv() {
            Ok(b) => *b,
            Err(_) => Buffers::with_capacity(self.policy.row_group_rows),
        }
    }

    pub fn push(&mut self, pid: u32, kind: &str, r: &ts_request_record) -> Result<()> {
        self.buffers.push(pid, kind, r);
        self.rows += 1;
        if self.window_start.is_none() {
            self.window_start = Some(Instant::now());
        }
        if self.buffers.len() >= self.policy.row_group_rows {
            let fresh = self.fresh_buffers();
            let b = std::mem::replace(&mut self.buffers, fresh);
            self.send(Cmd::Rows(Box::new(b)))?;
        }
        Ok(())
    }

    /// Rows accepted so far (buffered or written).
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Bytes on disk so far: closed files plus what the open one has flushed.
    pub fn bytes_written(&self) -> u64 {
        self.bytes.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Time-based rotation; call regularly. The clock starts at the first
    /// row after a rotation, so at most `rotate_after` of requests are ever
    /// outside a closed, readable file.
    pub fn tick(&mut self, now: Instant) -> Result<()> {
        let due = self
            .window_start
            .is_some_and(|t| now.duration_since(t) >= self.policy.rotate_after);
        if due {
            self.window_start = None;
            let fresh = self.fresh_buffers();
            let b = std::mem::replace(&mut self.buffers, fresh);
            if b.len() > 0 {
                self.send(Cmd::Rows(Box::new(b)))?;
            }
            self.send(Cmd::Rotate)?;
        }
        Ok(())
    }

    /// Hands a command to the writer thread. If the thread has stopped, it
    /// failed: its error is the answer.
    fn send(&mut self, cmd: Cmd) -> Result<()> {
        let sent = self.tx.as_ref().is_some_and(|tx| tx.send(cmd).is_ok());
        if sent {
            return Ok(());
        }
        self.tx = None;
        match self.worker.take().map(|w| w.join()) {
            Some(Ok(Err(e))) => Err(e),
            Some(Err(_)) => Err(AgentError::internal("the writer thread panicked")),
            _ => Err(AgentError::internal("the writer thread stopped")),
        }
    }

    /// Writes what is buffered and closes the file. A recording with no
    /// requests still gets one (empty) file, so readers see the schema.
    pub fn finish(mut self) -> Result<WriterSummary> {
        let b = std::mem::take(&mut self.buffers);
        if b.len() > 0 {
            self.send(Cmd::Rows(Box::new(b)))?;
        }
        self.tx = None; // the thread drains the channel, then finishes
        let mut summary = match self.worker.take().map(|w| w.join()) {
            Some(Ok(r)) => r?,
            Some(Err(_)) => return Err(AgentError::internal("the writer thread panicked")),
            None => return Err(AgentError::internal("the writer thread stopped")),
        };
        summary.rows = self.rows;
        Ok(summary)
    }
}

impl FileSink {
    fn open_file(&mut self) -> Result<&mut OpenFile> {
        if self.file.is_none() {
            let name = format!("part-{:05}.parquet", self.next_index);
            self.next_index += 1;
            let final_path = self.requests_dir.join(&name);
            let tmp_path = self.requests_dir.join(format!(".{name}.inprogress"));
            let f = File::create(&tmp_path).map_err(|e| io_err("cannot create", &tmp_path, e))?;
            let writer =
                SerializedFileWriter::new(f, self.parquet_schema.clone(), self.props.clone())
                    .map_err(|e| io_err("cannot start Parquet file", &tmp_path, e))?;
            self.file = Some(OpenFile {
                writer,
                tmp_path,
                final_path,
                rows: 0,
            });
        }
        Ok(self.file.as_mut().expect("just opened"))
    }

    fn write_rows(&mut self, mut b: Box<Buffers>) -> Result<()> {
        let n = b.len();
        if n > 0 {
            self.write_row_group(&b)?;
        }
        b.clear();
        // The drain loop may have finished: then the buffers just go.
        let _ = self.spare.send(b);
        Ok(())
    }

    /// One row group, column by column, through the typed column writers.
    fn write_row_group(&mut self, b: &Buffers) -> Result<()> {
        let rotate_rows = self.policy.rotate_rows;
        let closed = self.summary.bytes;
        // The kind column as byte arrays: one shared buffer per distinct
        // kind, so a row costs a reference count.
        let table: Vec<ByteArray> = b
            .kinds
            .iter()
            .map(|k| ByteArray::from(k.as_bytes().to_vec()))
            .collect();
        let mut kind_values = std::mem::take(&mut self.kind_values);
        kind_values.clear();
        kind_values.extend(b.kind.iter().map(|&k| table[k as usize].clone()));
        let f = self.open_file()?;
        let tmp = f.tmp_path.clone();
        let err = |e: parquet::errors::ParquetError| io_err("cannot write", &tmp, e);
        let mut rg = f.writer.next_row_group().map_err(err)?;
        let mut i = 0;
        while let Some(mut col) = rg.next_column().map_err(err)? {
            let Some(src) = SOURCES.get(i) else {
                return Err(AgentError::internal(
                    "the requests schema has extra columns",
                ));
            };
            match *src {
                Src::I64(c) => col.typed::<Int64Type>().write_batch(&b.i64s[c], None, None),
                Src::I32(c) => col.typed::<Int32Type>().write_batch(&b.i32s[c], None, None),
                Src::Kind => col
                    .typed::<ByteArrayType>()
                    .write_batch(&kind_values, None, None),
                Src::Flag(c) => col.typed::<BoolType>().write_batch(&b.flags[c], None, None),
            }
            .and_then(|_| col.close())
            .map_err(err)?;
            i += 1;
        }
        rg.close().map_err(err)?;
        f.rows += b.len() as u64;
        let open = f.writer.bytes_written() as u64;
        let full = f.rows >= rotate_rows;
        kind_values.clear();
        self.kind_values = kind_values;
        self.bytes
            .store(closed + open, std::sync::atomic::Ordering::Relaxed);
        if full {
            self.close_file()?;
        }
        Ok(())
    }

    fn close_file(&mut self) -> Result<()> {
        let Some(f) = self.file.take() else {
            return Ok(());
        };
        let OpenFile {
            writer,
            tmp_path,
            final_path,
            ..
        } = f;
        let file = writer
            .into_inner()
            .map_err(|e| io_err("cannot finish", &tmp_path, e))?;
        file.sync_all()
            .map_err(|e| io_err("cannot sync", &tmp_path, e))?;
        drop(file);
        std::fs::rename(&tmp_path, &final_path)
            .map_err(|e| io_err("cannot rename", &tmp_path, e))?;
        let len = std::fs::metadata(&final_path)
            .map_err(|e| io_err("cannot stat", &final_path, e))?
            .len();
        self.summary.bytes += len;
        self.bytes
            .store(self.summary.bytes, std::sync::atomic::Ordering::Relaxed);
        let rel = final_path
            .strip_prefix(&self.dir)
            .unwrap_or(&final_path)
            .to_string_lossy()
            .into_owned();
        self.summary.files.push(rel);
        Ok(())
    }

    fn finish(mut self) -> Result<WriterSummary> {
        if self.summary.files.is_empty() && self.file.is_none() {
            self.open_file()?;
        }
        self.close_file()?;
        Ok(self.summary)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use arrow_array::{Array, BooleanArray, UInt32Array, UInt64Array};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    pub fn tempdir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "tailscope-agent-test-{name}-{}-{}",
            std::process::id(),
            crate::sys::monotonic_ns()
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn schema_is_recording_json() {
        let rec = crate::schema::recording();
        let ours: Vec<(String, String)> = COLUMNS
            .iter()
            .map(|(n, t)| (n.to_string(), t.to_string()))
            .collect();
        let theirs: Vec<(String, String)> = rec
            .tables
            .requests
            .iter()
            .map(|c| (c.name.clone(), c.ty.clone()))
            .collect();
        assert_eq!(
            ours, theirs,
            "writer columns differ from schema/recording.json"
        );
        // And the Arrow schema really has those types.
        let schema = requests_schema();
        for (field, spec) in schema.fields().iter().zip(&rec.tables.requests) {
            assert_eq!(field.name(), &spec.name);
            assert_eq!(Some(field.data_type().clone()), arrow_type(&spec.ty));
        }
    }

    fn synthetic(i: u64, rng: &mut u64) -> ts_request_record {
        let mut next = || {
            *rng ^= *rng << 13;
            *rng ^= *rng >> 7;
            *rng ^= *rng << 17;
            *rng
        };
        // Exponential-ish latency around 50 µs, counters consistent with it.
        let latency = 20_000
            + (next() % 60_000)
            + if next() % 100 == 0 {
                next() % 5_000_000
            } else {
                0
            };
        let runnable = if next() % 10 == 0 {
            next() % (latency / 2)
        } else {
            0
        };
        let blocked = if next() % 4 == 0 {
            next() % (latency / 4)
        } else {
            0
        };
        let oncpu =
            latency - runnable - blocked - (next() % 2000).min(latency - runnable - blocked);
        let irq = if next() % 20 == 0 { next() % 5_000 } else { 0 };
        ts_request_record {
            request_id: i,
            start_ns: 1_000_000_000_000 + i * 12_345 + next() % 1000,
            latency_ns: latency,
            tid: 4000 + (i % 4) as u32,
            kind: 1,
            flags: TS_REC_SAMPLED | TS_REC_COUNTERS,
            oncpu_ns: oncpu,
            runnable_ns: runnable,
            blocked_ns: blocked,
            irq_ns: irq,
            softirq_ns: 0,
            runnable_count: (runnable > 0) as u32,
            blocked_count: (blocked > 0) as u32,
            irq_count: (irq > 0) as u32,
            softirq_count: 0,
            fault_user_count: (next() % 50 == 0) as u32,
            fault_kernel_count: 0,
            migrations: 0,
            vol_switches: (blocked > 0) as u32,
            invol_switches: (runnable > 0) as u32,
            cpu: (next() % 2) as u32,
        }
    }

    fn read_all(dir: &Path, files: &[String]) -> Vec<RecordBatch> {
        let mut out = vec![];
        for f in files {
            let file = File::open(dir.join(f)).unwrap();
            let reader = ParquetRecordBatchReaderBuilder::try_new(file)
                .unwrap()
                .build()
                .unwrap();
            for b in reader {
                out.push(b.unwrap());
            }
        }
        out
    }

    #[test]
    fn round_trip_with_rotation() {
        let dir = tempdir("roundtrip");
        let policy = WriterPolicy {
            row_group_rows: 1000,
            rotate_rows: 2500,
            rotate_after: Duration::from_secs(3600),
        };
        let mut w = RequestWriter::new(&dir, policy).unwrap();
        let mut rng = 1u64;
        let mut rows = vec![];
        for i in 0..6000 {
            let mut r = synthetic(i, &mut rng);
            if i % 7 == 0 {
                r.flags = TS_REC_SAMPLED | TS_REC_INFERRED;
            }
            if i % 11 == 0 {
                r.flags |= TS_REC_TORN;
            }
            let kind = ["GET", "SET", ""][(i % 3) as usize];
            w.push(7, kind, &r).unwrap();
            rows.push((kind, r));
        }
        let s = w.finish().unwrap();
        assert_eq!(s.rows, 6000);
        // 2500-row rotation at 1000-row groups: files of 3000, 3000.
        assert_eq!(
            s.files,
            vec!["requests/part-00000.parquet", "requests/part-00001.parquet"]
        );
        let on_disk: u64 = s
            .files
            .iter()
            .map(|f| std::fs::metadata(dir.join(f)).unwrap().len())
            .sum();
        assert_eq!(on_disk, s.bytes);
        // `kind` is PLAIN: pyarrow reads it as a dictionary, which it cannot
        // do from DELTA_BYTE_ARRAY (a version-2 writer's fallback).
        for f in &s.files {
            let meta = ParquetRecordBatchReaderBuilder::try_new(File::open(dir.join(f)).unwrap())
                .unwrap()
                .metadata()
                .clone();
            let rg = meta.row_group(0);
            let kind = (0..rg.num_columns())
                .map(|i| rg.column(i))
                .find(|c| c.column_path().string() == "kind")
                .expect("a kind column");
            assert!(
                !kind.encodings().contains(&Encoding::DELTA_BYTE_ARRAY),
                "{f}: kind is encoded {:?}",
                kind.encodings()
            );
            // The per-column choices: delta for the four stepping columns,
            // no dictionaries anywhere, zstd on the PLAIN columns.
            for c in (0..rg.num_columns()).map(|i| rg.column(i)) {
                let name = c.column_path().string();
                let delta = DELTA_COLUMNS.contains(&name.as_str());
                assert_eq!(
                    c.encodings().contains(&Encoding::DELTA_BINARY_PACKED),
                    delta,
                    "{f}: {name} is encoded {:?}",
                    c.encodings()
                );
                let ty = COLUMNS.iter().find(|(n, _)| *n == name).unwrap().1;
                if !delta && ty != "bool" {
                    assert!(
                        c.encodings().contains(&Encoding::PLAIN),
                        "{f}: {name} is encoded {:?}",
                        c.encodings()
                    );
                }
                assert!(
                    !c.encodings().contains(&Encoding::RLE_DICTIONARY),
                    "{f}: {name} has a dictionary"
                );
                let want = if delta {
                    Compression::UNCOMPRESSED
                } else {
                    Compression::ZSTD(ZstdLevel::try_new(1).unwrap())
                };
                assert_eq!(c.compression(), want, "{f}: {name}");
                assert_eq!(
                    c.statistics().is_some(),
                    name == "start_ns",
                    "{f}: {name} statistics"
                );
            }
            // Readers that map Parquet to Arrow find the Arrow schema, and
            // the file says which recording schema it follows.
            let kv = meta
                .file_metadata()
                .key_value_metadata()
                .expect("kv metadata");
            let get = |k: &str| kv.iter().find(|e| e.key == k).and_then(|e| e.value.clone());
            assert!(get("ARROW:schema").is_some(), "{f}: no ARROW:schema");
            assert_eq!(
                get(SCHEMA_VERSION_KEY),
                Some(crate::schema::schema_version().to_string()),
                "{f}"
            );
        }
        let batches = read_all(&dir, &s.files);
        assert_eq!(batches[0].schema().fields(), requests_schema().fields());
        let mut i = 0;
        for b in &batches {
            let col = |n: &str| b.column_by_name(n).unwrap().clone();
            let u64c = |n: &str| {
                col(n)
                    .as_any()
                    .downcast_ref::<UInt64Array>()
                    .unwrap()
                    .clone()
            };
            let u32c = |n: &str| {
                col(n)
                    .as_any()
                    .downcast_ref::<UInt32Array>()
                    .unwrap()
                    .clone()
            };
            let boolc = |n: &str| {
                col(n)
                    .as_any()
                    .downcast_ref::<BooleanArray>()
                    .unwrap()
                    .clone()
            };
            let kind = col("kind");
            let kind = kind
                .as_any()
                .downcast_ref::<arrow_array::StringArray>()
                .unwrap();
            for j in 0..b.num_rows() {
                let (k, r) = &rows[i];
                assert_eq!(kind.value(j), *k);
                assert_eq!(u64c("request_id").value(j), r.request_id);
                assert_eq!(u32c("pid").value(j), 7);
                assert_eq!(u32c("tid").value(j), r.tid);
                assert_eq!(u64c("start_ns").value(j), r.start_ns);
                assert_eq!(u64c("latency_ns").value(j), r.latency_ns);
                assert_eq!(u64c("on_cpu_ns").value(j), r.oncpu_ns);
                assert_eq!(u64c("runnable_wait_ns").value(j), r.runnable_ns);
                assert_eq!(u64c("blocked_wait_ns").value(j), r.blocked_ns);
                assert_eq!(u64c("irq_ns").value(j), r.irq_ns);
                assert_eq!(u64c("softirq_ns").value(j), r.softirq_ns);
                assert_eq!(u32c("runnable_wait_count").value(j), r.runnable_count);
                assert_eq!(u32c("blocked_wait_count").value(j), r.blocked_count);
                assert_eq!(u32c("irq_count").value(j), r.irq_count);
                assert_eq!(u32c("softirq_count").value(j), r.softirq_count);
                assert_eq!(u32c("fault_user_count").value(j), r.fault_user_count);
                assert_eq!(u32c("fault_kernel_count").value(j), r.fault_kernel_count);
                assert_eq!(u32c("migration_count").value(j), r.migrations);
                assert_eq!(u32c("voluntary_switch_count").value(j), r.vol_switches);
                assert_eq!(u32c("involuntary_switch_count").value(j), r.invol_switches);
                assert_eq!(u32c("cpu").value(j), r.cpu);
                assert!(boolc("sampled").value(j));
                assert_eq!(boolc("inferred").value(j), r.flags & TS_REC_INFERRED != 0);
                assert_eq!(
                    boolc("counters_valid").value(j),
                    r.flags & TS_REC_COUNTERS != 0 && r.flags & TS_REC_TORN == 0
                );
                i += 1;
            }
        }
        assert_eq!(i, 6000);
        // No in-progress files left behind.
        let names: Vec<_> = std::fs::read_dir(dir.join("requests"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Every field of a record lands in its own column: each field holds a
    /// value no other field has (and some hold unsigned values past the
    /// signed range), so swapping two entries of `SOURCES` or of
    /// `Buffers::push` fails here.
    #[test]
    fn every_field_lands_in_its_own_column() {
        let dir = tempdir("fields");
        let mut w = RequestWriter::new(&dir, WriterPolicy::default()).unwrap();
        let rec = |i: u64| {
            let v = |k: u64| k * 1_000 + i;
            ts_request_record {
                request_id: v(1),
                start_ns: v(2),
                latency_ns: u64::MAX - v(3),
                tid: u32::MAX - v(4) as u32,
                kind: 1,
                flags: TS_REC_SAMPLED | TS_REC_COUNTERS,
                oncpu_ns: v(5),
                runnable_ns: v(6),
                blocked_ns: v(7),
                irq_ns: v(8),
                softirq_ns: v(9),
                runnable_count: v(10) as u32,
                blocked_count: v(11) as u32,
                irq_count: v(12) as u32,
                softirq_count: v(13) as u32,
                fault_user_count: v(14) as u32,
                fault_kernel_count: v(15) as u32,
                migrations: v(16) as u32,
                vol_switches: v(17) as u32,
                invol_switches: v(18) as u32,
                cpu: v(19) as u32,
            }
        };
        for i in 0..3 {
            w.push(u32::MAX - 20, "GET", &rec(i)).unwrap();
        }
        let s = w.finish().unwrap();
        let batches = read_all(&dir, &s.files);
        let b = &batches[0];
        assert_eq!(b.num_rows(), 3);
        let want_u64 = [
            ("request_id", 1u64),
            ("start_ns", 2),
            ("on_cpu_ns", 5),
            ("runnable_wait_ns", 6),
            ("blocked_wait_ns", 7),
            ("irq_ns", 8),
            ("softirq_ns", 9),
        ];
        let want_u32 = [
            ("runnable_wait_count", 10u64),
            ("blocked_wait_count", 11),
            ("irq_count", 12),
            ("softirq_count", 13),
            ("fault_user_count", 14),
            ("fault_kernel_count", 15),
            ("migration_count", 16),
            ("voluntary_switch_count", 17),
            ("involuntary_switch_count", 18),
            ("cpu", 19),
        ];
        for j in 0..3usize {
            let i = j as u64;
            let col = |n: &str| b.column_by_name(n).unwrap().clone();
            let u64v = |n: &str| {
                col(n)
                    .as_any()
                    .downcast_ref::<UInt64Array>()
                    .unwrap()
                    .value(j)
            };
            let u32v = |n: &str| {
                col(n)
                    .as_any()
                    .downcast_ref::<UInt32Array>()
                    .unwrap()
                    .value(j)
            };
            for (n, k) in want_u64 {
                assert_eq!(u64v(n), k * 1_000 + i, "{n} row {j}");
            }
            for (n, k) in want_u32 {
                assert_eq!(u32v(n) as u64, k * 1_000 + i, "{n} row {j}");
            }
            assert_eq!(u64v("latency_ns"), u64::MAX - (3_000 + i), "row {j}");
            assert_eq!(u32v("tid"), u32::MAX - (4_000 + i) as u32, "row {j}");
            assert_eq!(u32v("pid"), u32::MAX - 20, "row {j}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn empty_recording_has_one_readable_file() {
        let dir = tempdir("empty");
        let w = RequestWriter::new(&dir, WriterPolicy::default()).unwrap();
        let s = w.finish().unwrap();
        assert_eq!(s.files, vec!["requests/part-00000.parquet"]);
        let f = File::open(dir.join(&s.files[0])).unwrap();
        let b = ParquetRecordBatchReaderBuilder::try_new(f).unwrap();
        assert_eq!(b.schema().fields(), requests_schema().fields());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// 1M synthetic requests with default policy; prints bytes/request.
    /// Budget: 64 B/request.
    #[test]
    fn bytes_per_request() {
        let dir = tempdir("size");
        let mut w = RequestWriter::new(&dir, WriterPolicy::default()).unwrap();
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let n = 1_000_000u64;
        let cpu0 = crate::sys::self_cpu_seconds();
        for i in 0..n {
            let r = synthetic(i, &mut rng);
            w.push(1234, if i % 5 == 0 { "SET" } else { "GET" }, &r)
                .unwrap();
        }
        let s = w.finish().unwrap();
        let cpu = crate::sys::self_cpu_seconds() - cpu0;
        let per = s.bytes as f64 / n as f64;
        eprintln!(
            "bytes_per_request: {} rows, {} bytes in {} file(s) = {per:.1} B/request; CPU {:.0} ns/request (whole test process: run alone to read it)",
            n,
            s.bytes,
            s.files.len(),
            cpu * 1e9 / n as f64
        );
        assert!(per <= 64.0, "{per} B/request exceeds the 64 B budget");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// A measurement, not a check: how much CPU each Parquet encoding costs per
/// row on a real recording, for the whole table and per column (the choice
/// in [`properties`] comes from it). Run on a recording's file:
/// `TS_ENC_BENCH=rec/requests/part-00000.parquet cargo test --release -p
/// tailscope-agent --lib encoding_bench -- --ignored --nocapture`.
#[cfg(test)]
mod encoding_bench {
    use super::*;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use parquet::file::properties::WriterPropertiesBuilder;

    fn cpu_ns() -> u64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid timespec out-pointer.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    }

    fn base() -> WriterPropertiesBuilder {
        WriterProperties::builder()
            .set_writer_version(WriterVersion::PARQUET_2_0)
            .set_dictionary_enabled(false)
            .set_statistics_enabled(EnabledStatistics::None)
            .set_column_statistics_enabled("start_ns".into(), EnabledStatistics::Chunk)
    }

    #[test]
    #[ignore]
    fn encodings() {
        let Ok(path) = std::env::var("TS_ENC_BENCH") else {
            eprintln!("SKIP: set TS_ENC_BENCH to a recording's requests/part-N.parquet");
            return;
        };
        let f = File::open(path).unwrap();
        let batches: Vec<RecordBatch> = ParquetRecordBatchReaderBuilder::try_new(f)
            .unwrap()
            .with_batch_size(65536)
            .build()
            .unwrap()
            .map(|b| b.unwrap())
            .collect();
        let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
        let ints: Vec<&str> = COLUMNS
            .iter()
            .filter(|(_, t)| t.starts_with("uint"))
            .map(|(n, _)| *n)
            .collect();
        let z1 = Compression::ZSTD(ZstdLevel::try_new(1).unwrap());
        let mut cands: Vec<(&str, WriterProperties)> = vec![];
        cands.push(("current", properties()));
        cands.push(("session8", properties_session8()));
        let mut b = base().set_compression(Compression::UNCOMPRESSED);
        for c in &ints {
            b = b.set_column_encoding((*c).into(), Encoding::DELTA_BINARY_PACKED);
        }
        b = b.set_column_dictionary_enabled("kind".into(), true);
        cands.push(("delta-all-nocomp-kinddict", b.build()));
        let mut b = base().set_compression(z1);
        for c in &ints {
            b = b.set_column_encoding((*c).into(), Encoding::DELTA_BINARY_PACKED);
        }
        b = b.set_column_dictionary_enabled("kind".into(), true);
        cands.push(("delta-all-zstd1-kinddict", b.build()));
        let mut b = base().set_compression(Compression::UNCOMPRESSED);
        for c in &ints {
            b = b.set_column_encoding((*c).into(), Encoding::DELTA_BINARY_PACKED);
        }
        b = b.set_column_dictionary_enabled("kind".into(), true);
        for c in ["request_id", "start_ns", "latency_ns", "on_cpu_ns"] {
            b = b.set_column_compression(c.into(), z1);
        }
        cands.push(("delta-all-zstd-4big", b.build()));
        let mut b = base().set_compression(z1);
        b = b.set_column_dictionary_enabled("kind".into(), true);
        cands.push(("plain-zstd1-kinddict", b.build()));
        let mut b = base().set_compression(Compression::UNCOMPRESSED);
        for c in &ints {
            b = b.set_column_encoding((*c).into(), Encoding::DELTA_BINARY_PACKED);
        }
        b = b.set_column_encoding("kind".into(), Encoding::DELTA_BYTE_ARRAY);
        cands.push(("delta-all-nocomp-kinddba", b.build()));
        let mut b = base().set_compression(Compression::UNCOMPRESSED);
        for c in &ints {
            b = b.set_column_encoding((*c).into(), Encoding::DELTA_BINARY_PACKED);
        }
        b = b.set_column_compression("kind".into(), z1);
        cands.push(("delta-all-nocomp-kindzstd", b.build()));
        // Per column: each encoding alone, best of 7 (CPU ns/row, B/row).
        let schema = batches[0].schema();
        let opts: Vec<(&str, Encoding, Compression, bool)> = vec![
            ("plain+zstd1", Encoding::PLAIN, z1, false),
            (
                "delta+none",
                Encoding::DELTA_BINARY_PACKED,
                Compression::UNCOMPRESSED,
                false,
            ),
            ("delta+zstd1", Encoding::DELTA_BINARY_PACKED, z1, false),
            (
                "dict+none",
                Encoding::PLAIN,
                Compression::UNCOMPRESSED,
                true,
            ),
            ("dict+zstd1", Encoding::PLAIN, z1, true),
            (
                "plain+none",
                Encoding::PLAIN,
                Compression::UNCOMPRESSED,
                false,
            ),
            ("rle+none", Encoding::RLE, Compression::UNCOMPRESSED, false),
            (
                "dba+none",
                Encoding::DELTA_BYTE_ARRAY,
                Compression::UNCOMPRESSED,
                false,
            ),
        ];
        for (ci, field) in schema.fields().iter().enumerate() {
            let s1 = Arc::new(Schema::new(vec![field.as_ref().clone()]));
            let cols: Vec<RecordBatch> = batches
                .iter()
                .map(|b| RecordBatch::try_new(s1.clone(), vec![b.column(ci).clone()]).unwrap())
                .collect();
            let mut line = format!("{:26}", field.name());
            for (on, enc, comp, dict) in &opts {
                let ty = field.data_type();
                let ok = match enc {
                    Encoding::DELTA_BINARY_PACKED => ty.is_integer(),
                    Encoding::RLE => *ty == DataType::Boolean,
                    Encoding::DELTA_BYTE_ARRAY => *ty == DataType::Utf8,
                    _ => true,
                };
                if !ok || (*dict && *ty == DataType::Boolean) {
                    continue;
                }
                let mut b = base().set_compression(*comp).set_dictionary_enabled(*dict);
                if !*dict {
                    b = b.set_encoding(*enc);
                }
                let props = b.build();
                let mut best = u64::MAX;
                let mut size = 0;
                for _ in 0..7 {
                    let t0 = cpu_ns();
                    let mut w =
                        ArrowWriter::try_new(Vec::new(), s1.clone(), Some(props.clone())).unwrap();
                    for b in &cols {
                        w.write(b).unwrap();
                        w.flush().unwrap();
                    }
                    let out = w.into_inner().unwrap();
                    best = best.min(cpu_ns() - t0);
                    size = out.len();
                }
                line += &format!(
                    " | {on} {:.1}ns {:.2}B",
                    best as f64 / rows as f64,
                    size as f64 / rows as f64
                );
            }
            eprintln!("{line}");
        }
        cands.retain(|(n, _)| n.starts_with("current") || n.starts_with("session8"));
        for (name, props) in cands {
            let mut best = u64::MAX;
            let mut size = 0;
            for _ in 0..5 {
                let t0 = cpu_ns();
                let mut w =
                    ArrowWriter::try_new(Vec::new(), batches[0].schema(), Some(props.clone()))
                        .unwrap();
                for b in &batches {
                    w.write(b).unwrap();
                    w.flush().unwrap();
                }
                let out = w.into_inner().unwrap();
                best = best.min(cpu_ns() - t0);
                size = out.len();
            }
            eprintln!(
                "{name:32} {:6.1} ns/row {:6.2} B/row",
                best as f64 / rows as f64,
                size as f64 / rows as f64
            );
        }
    }
}
