//! A generic Parquet table writer for the LDB tables (`functions`, `locks`,
//! `request_events`): columns declared as `(name, type)` pairs that tests pin
//! to `schema/recording.json`, rows buffered column-wise, a row group every
//! [`ROW_GROUP_ROWS`] rows, and the file rotated like the requests table
//! (hidden `.part-N.parquet.inprogress` until closed).
//!
//! The caller (the observer) only appends to column buffers. Building the
//! Arrow arrays, zstd and the file writes run on a writer thread per table
//! at nice 19, like the requests table's (writer.rs): a 64 Ki-row group of
//! lock events takes tens of ms to encode, which on the observer thread
//! stretched one scan gap by as much, and at normal priority would hold a
//! CPU the target wants.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use arrow_array::{ArrayRef, BooleanArray, RecordBatch, StringArray, UInt32Array, UInt64Array};
use arrow_schema::{Field, Schema, SchemaRef};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::properties::{WriterProperties, WriterVersion};

use crate::error::{exit, AgentError, Result};
use crate::writer::{arrow_type, WriterSummary};

pub const ROW_GROUP_ROWS: usize = 65_536;
const ROTATE_ROWS: u64 = 2_000_000;
const ROTATE_AFTER: Duration = Duration::from_secs(60);
/// Row groups that may wait for the writer thread before `push` blocks.
const PENDING_ROW_GROUPS: usize = 4;

/// One cell of a row. Strings are the tables' fixed event names.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    U64(u64),
    U32(u32),
    Str(&'static str),
    Bool(bool),
}

enum Column {
    U64(Vec<u64>),
    U32(Vec<u32>),
    Str(Vec<&'static str>),
    Bool(Vec<bool>),
}

impl Column {
    fn new(ty: &str) -> Column {
        match ty {
            "uint64" => Column::U64(vec![]),
            "uint32" => Column::U32(vec![]),
            "string" => Column::Str(vec![]),
            "bool" => Column::Bool(vec![]),
            other => panic!("column type {other} (pinned by tests)"),
        }
    }
    fn empty_like(&self) -> Column {
        match self {
            Column::U64(_) => Column::U64(vec![]),
            Column::U32(_) => Column::U32(vec![]),
            Column::Str(_) => Column::Str(vec![]),
            Column::Bool(_) => Column::Bool(vec![]),
        }
    }
    fn into_array(self) -> ArrayRef {
        match self {
            Column::U64(v) => Arc::new(UInt64Array::from(v)),
            Column::U32(v) => Arc::new(UInt32Array::from(v)),
            Column::Str(v) => Arc::new(StringArray::from(v)),
            Column::Bool(v) => Arc::new(BooleanArray::from(v)),
        }
    }
}

/// What the writer thread is asked to do.
enum Cmd {
    /// Write these columns as a row group (and rotate by rows if due).
    Rows(Vec<Column>),
    /// Close the open file (time-based rotation).
    Rotate,
}

/// The observer's side: column buffers, handed to the writer thread a row
/// group at a time.
pub struct TableWriter {
    table: &'static str,
    columns: Vec<Column>,
    rows_buffered: usize,
    rows: u64,
    window_start: Option<Instant>,
    tx: Option<SyncSender<Cmd>>,
    worker: Option<JoinHandle<Result<WriterSummary>>>,
    bytes: Arc<AtomicU64>,
}

/// The writer thread's side: files on disk.
struct Sink {
    dir: PathBuf,
    table_dir: PathBuf,
    table: &'static str,
    schema: SchemaRef,
    file: Option<(ArrowWriter<File>, PathBuf, PathBuf, u64)>,
    next_index: u32,
    summary: WriterSummary,
    dictionary: &'static [&'static str],
    delta: &'static [&'static str],
    bytes: Arc<AtomicU64>,
}

fn io_err(what: &str, path: &Path, e: impl std::fmt::Display) -> AgentError {
    AgentError::new(exit::INTERNAL, format!("{what} {}: {e}", path.display()))
}

impl TableWriter {
    /// `dir` is the recording; files go to `dir/<table>/`. `dictionary`
    /// and `delta` name columns to dictionary- or delta-encode.
    pub fn new(
        dir: &Path,
        table: &'static str,
        columns: &[(&'static str, &'static str)],
        dictionary: &'static [&'static str],
        delta: &'static [&'static str],
    ) -> Result<Self> {
        let table_dir = dir.join(table);
        std::fs::create_dir_all(&table_dir).map_err(|e| {
            AgentError::new(
                exit::OUTPUT,
                format!("cannot create {}: {e}", table_dir.display()),
            )
        })?;
        let fields: Vec<Field> = columns
            .iter()
            .map(|(n, t)| Field::new(*n, arrow_type(t).expect("known type"), false))
            .collect();
        let bytes = Arc::new(AtomicU64::new(0));
        let mut sink = Sink {
            dir: dir.to_path_buf(),
            table_dir,
            table,
            schema: Arc::new(Schema::new(fields)),
            file: None,
            next_index: 0,
            summary: WriterSummary::default(),
            dictionary,
            delta,
            bytes: bytes.clone(),
        };
        let (tx, rx) = sync_channel::<Cmd>(PENDING_ROW_GROUPS);
        let worker = std::thread::Builder::new()
            .name(format!("ts-{}", &table[..table.len().min(12)]))
            .spawn(move || {
                // Bulk work that can wait: only CPU time the target leaves.
                // SAFETY: a plain syscall on this thread.
                unsafe {
                    libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19);
                }
                for cmd in rx {
                    match cmd {
                        Cmd::Rows(cols) => sink.write_rows(cols)?,
                        Cmd::Rotate => sink.close_file()?,
                    }
                }
                sink.finish()
            })
            .map_err(|e| {
                AgentError::internal(format!("cannot start the {table} writer thread: {e}"))
            })?;
        Ok(TableWriter {
            table,
            columns: columns.iter().map(|(_, t)| Column::new(t)).collect(),
            rows_buffered: 0,
            rows: 0,
            window_start: None,
            tx: Some(tx),
            worker: Some(worker),
            bytes,
        })
    }

    /// Appends a row; `row` must match the columns in order and type.
    pub fn push(&mut self, row: &[Cell]) -> Result<()> {
        debug_assert_eq!(row.len(), self.columns.len());
        for (col, cell) in self.columns.iter_mut().zip(row) {
            match (col, cell) {
                (Column::U64(v), Cell::U64(x)) => v.push(*x),
                (Column::U32(v), Cell::U32(x)) => v.push(*x),
                (Column::Str(v), Cell::Str(x)) => v.push(x),
                (Column::Bool(v), Cell::Bool(x)) => v.push(*x),
                _ => {
                    return Err(AgentError::internal(format!(
                        "{}: a row does not match the table's column types",
                        self.table
                    )))
                }
            }
        }
        self.rows_buffered += 1;
        self.rows += 1;
        if self.window_start.is_none() {
            self.window_start = Some(Instant::now());
        }
        if self.rows_buffered >= ROW_GROUP_ROWS {
            self.send_rows()?;
        }
        Ok(())
    }

    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Bytes on disk so far (closed files plus the open one's flushed part).
    pub fn bytes_written(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Time-based rotation; call regularly.
    pub fn tick(&mut self, now: Instant) -> Result<()> {
        if self
            .window_start
            .is_some_and(|t| now.duration_since(t) >= ROTATE_AFTER)
        {
            self.window_start = None;
            self.send_rows()?;
            self.send(Cmd::Rotate)?;
        }
        Ok(())
    }

    fn send_rows(&mut self) -> Result<()> {
        if self.rows_buffered == 0 {
            return Ok(());
        }
        let fresh = self.columns.iter().map(Column::empty_like).collect();
        let cols = std::mem::replace(&mut self.columns, fresh);
        self.rows_buffered = 0;
        self.send(Cmd::Rows(cols))
    }

    /// Hands a command to the writer thread. If the thread has stopped, it
    /// failed: its error is the answer.
    fn send(&mut self, cmd: Cmd) -> Result<()> {
        if self.tx.as_ref().is_some_and(|tx| tx.send(cmd).is_ok()) {
            return Ok(());
        }
        self.tx = None;
        match self.worker.take().map(|w| w.join()) {
            Some(Ok(Err(e))) => Err(e),
            Some(Err(_)) => Err(AgentError::internal(format!(
                "the {} writer thread panicked",
                self.table
            ))),
            _ => Err(AgentError::internal(format!(
                "the {} writer thread stopped",
                self.table
            ))),
        }
    }

    /// Writes what is buffered and closes the file; an empty table still
    /// gets one file so that readers see its schema.
    pub fn finish(mut self) -> Result<WriterSummary> {
        self.send_rows()?;
        self.tx = None; // the thread drains the channel, then finishes
        let mut summary = match self.worker.take().map(|w| w.join()) {
            Some(Ok(r)) => r?,
            Some(Err(_)) => {
                return Err(AgentError::internal(format!(
                    "the {} writer thread panicked",
                    self.table
                )))
            }
            None => {
                return Err(AgentError::internal(format!(
                    "the {} writer thread stopped",
                    self.table
                )))
            }
        };
        summary.rows = self.rows;
        Ok(summary)
    }
}

impl Sink {
    fn properties(&self) -> WriterProperties {
        let mut b = WriterProperties::builder()
            .set_writer_version(WriterVersion::PARQUET_2_0)
            .set_compression(Compression::ZSTD(
                ZstdLevel::try_new(3).expect("valid level"),
            ))
            .set_dictionary_enabled(false)
            .set_created_by(format!("tailscope-agent {}", env!("CARGO_PKG_VERSION")));
        for c in self.dictionary {
            b = b.set_column_dictionary_enabled((*c).into(), true);
        }
        for c in self.delta {
            b = b.set_column_encoding((*c).into(), Encoding::DELTA_BINARY_PACKED);
        }
        // Every other column says PLAIN (+ zstd): without a dictionary a
        // version-2 writer falls back to DELTA_BINARY_PACKED for integers
        // and DELTA_BYTE_ARRAY for strings (the requests writer had the same
        // defect until 325fbdc). Booleans keep the version-2 default, RLE.
        for f in self.schema.fields() {
            let name = f.name().as_str();
            if f.data_type() != &arrow_schema::DataType::Boolean
                && !self.dictionary.contains(&name)
                && !self.delta.contains(&name)
            {
                b = b.set_column_encoding(name.into(), Encoding::PLAIN);
            }
        }
        b.build()
    }

    fn write_rows(&mut self, cols: Vec<Column>) -> Result<()> {
        let arrays: Vec<ArrayRef> = cols.into_iter().map(Column::into_array).collect();
        let batch = RecordBatch::try_new(self.schema.clone(), arrays)
            .map_err(|e| AgentError::internal(format!("building a row group: {e}")))?;
        if batch.num_rows() == 0 {
            return Ok(());
        }
        if self.file.is_none() {
            let name = format!("part-{:05}.parquet", self.next_index);
            self.next_index += 1;
            let final_path = self.table_dir.join(&name);
            let tmp = self.table_dir.join(format!(".{name}.inprogress"));
            let f = File::create(&tmp).map_err(|e| io_err("cannot create", &tmp, e))?;
            let w = ArrowWriter::try_new(f, self.schema.clone(), Some(self.properties()))
                .map_err(|e| io_err("cannot start Parquet file", &tmp, e))?;
            self.file = Some((w, tmp, final_path, 0));
        }
        let closed = self.summary.bytes;
        let (w, tmp, _, rows) = self.file.as_mut().expect("just opened");
        *rows += batch.num_rows() as u64;
        w.write(&batch)
            .and_then(|_| w.flush())
            .map_err(|e| io_err("cannot write", tmp, e))?;
        self.bytes
            .store(closed + w.bytes_written() as u64, Ordering::Relaxed);
        if *rows >= ROTATE_ROWS {
            self.close_file()?;
        }
        Ok(())
    }

    fn close_file(&mut self) -> Result<()> {
        let Some((w, tmp, final_path, _)) = self.file.take() else {
            return Ok(());
        };
        let f = w
            .into_inner()
            .map_err(|e| io_err("cannot finish", &tmp, e))?;
        f.sync_all().map_err(|e| io_err("cannot sync", &tmp, e))?;
        drop(f);
        std::fs::rename(&tmp, &final_path).map_err(|e| io_err("cannot rename", &tmp, e))?;
        self.summary.bytes += std::fs::metadata(&final_path)
            .map_err(|e| io_err("cannot stat", &final_path, e))?
            .len();
        self.bytes.store(self.summary.bytes, Ordering::Relaxed);
        let rel = final_path
            .strip_prefix(&self.dir)
            .unwrap_or(&final_path)
            .to_string_lossy()
            .into_owned();
        self.summary.files.push(rel);
        Ok(())
    }

    /// Closes the file; an empty table still gets one, for its schema.
    fn finish(mut self) -> Result<WriterSummary> {
        if self.summary.files.is_empty() && self.file.is_none() {
            let path = self
                .table_dir
                .join(format!("part-{:05}.parquet", self.next_index));
            let f = File::create(&path).map_err(|e| io_err("cannot create", &path, e))?;
            let w = ArrowWriter::try_new(f, self.schema.clone(), Some(self.properties()))
                .map_err(|e| io_err("cannot start Parquet file", &path, e))?;
            w.close().map_err(|e| io_err("cannot finish", &path, e))?;
            self.summary.bytes += std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
            self.summary.files.push(format!(
                "{}/part-{:05}.parquet",
                self.table, self.next_index
            ));
            return Ok(self.summary);
        }
        self.close_file()?;
        Ok(self.summary)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::Array;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    const COLS: &[(&str, &str)] = &[
        ("ts_ns", "uint64"),
        ("tid", "uint32"),
        ("event", "string"),
        ("ok", "bool"),
    ];

    /// Rows pushed on the caller's thread come back from the files the
    /// writer thread wrote, in order, over several row groups.
    #[test]
    fn rows_round_trip_through_the_writer_thread() {
        let dir = crate::writer::tests::tempdir("ldb-table");
        let mut w = TableWriter::new(&dir, "locks", COLS, &["event"], &["ts_ns"]).unwrap();
        let n = ROW_GROUP_ROWS as u64 * 2 + 17;
        let names = ["MUTEX_WAIT", "MUTEX_LOCK", "MUTEX_UNLOCK"];
        for i in 0..n {
            w.push(&[
                Cell::U64(1_000 + i),
                Cell::U32((i % 7) as u32),
                Cell::Str(names[(i % 3) as usize]),
                Cell::Bool(i.is_multiple_of(2)),
            ])
            .unwrap();
        }
        assert!(w
            .push(&[Cell::U32(1), Cell::U32(1), Cell::Str("x"), Cell::Bool(true)])
            .is_err());
        let s = w.finish().unwrap();
        assert_eq!(s.rows, n);
        assert_eq!(s.files, vec!["locks/part-00000.parquet"]);
        let f = File::open(dir.join(&s.files[0])).unwrap();
        assert_eq!(f.metadata().unwrap().len(), s.bytes);
        let mut i = 0u64;
        for b in ParquetRecordBatchReaderBuilder::try_new(f)
            .unwrap()
            .build()
            .unwrap()
        {
            let b = b.unwrap();
            let ts = b
                .column(0)
                .as_any()
                .downcast_ref::<UInt64Array>()
                .unwrap()
                .clone();
            let ev = b
                .column(2)
                .as_any()
                .downcast_ref::<StringArray>()
                .unwrap()
                .clone();
            let ok = b
                .column(3)
                .as_any()
                .downcast_ref::<BooleanArray>()
                .unwrap()
                .clone();
            for j in 0..b.num_rows() {
                assert_eq!(ts.value(j), 1_000 + i);
                assert_eq!(ev.value(j), names[(i % 3) as usize]);
                assert_eq!(ok.value(j), i.is_multiple_of(2));
                assert!(ts.is_valid(j));
                i += 1;
            }
        }
        assert_eq!(i, n);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Each column is written with the encoding it was declared with:
    /// delta, dictionary, or PLAIN for the rest (a version-2 writer's own
    /// fallback for them is DELTA_BINARY_PACKED / DELTA_BYTE_ARRAY), all
    /// zstd-compressed.
    #[test]
    fn every_column_has_its_declared_encoding() {
        use parquet::file::reader::{FileReader, SerializedFileReader};
        const ALL: &[(&str, &str)] = &[
            ("ts_ns", "uint64"),
            ("tid", "uint32"),
            ("mutex", "uint64"),
            ("latency_ns", "uint64"),
            ("depth", "uint32"),
            ("event", "string"),
            ("note", "string"),
            ("ok", "bool"),
        ];
        let dir = crate::writer::tests::tempdir("ldb-table-enc");
        let mut w = TableWriter::new(&dir, "locks", ALL, &["tid", "event"], &["ts_ns"]).unwrap();
        for i in 0..5_000u64 {
            w.push(&[
                Cell::U64(1_000_000 + 7 * i),
                Cell::U32((i % 3) as u32),
                Cell::U64(0x7f00_0000_0000 + 64 * (i % 11)),
                Cell::U64(i * i % 9_973),
                Cell::U32((i % 5) as u32),
                Cell::Str(["MUTEX_LOCK", "MUTEX_UNLOCK"][(i % 2) as usize]),
                Cell::Str(["a", "bb", "ccc"][(i % 3) as usize]),
                Cell::Bool(i % 4 == 0),
            ])
            .unwrap();
        }
        let s = w.finish().unwrap();
        let r = SerializedFileReader::new(File::open(dir.join(&s.files[0])).unwrap()).unwrap();
        let rg = r.metadata().row_group(0);
        assert_eq!(rg.num_columns(), ALL.len());
        for c in rg.columns() {
            let name = c.column_path().string();
            let enc = c.encodings();
            let want = match name.as_str() {
                "ts_ns" => Encoding::DELTA_BINARY_PACKED,
                "tid" | "event" => Encoding::RLE_DICTIONARY,
                "ok" => Encoding::RLE,
                _ => Encoding::PLAIN,
            };
            assert!(enc.contains(&want), "{name}: {enc:?}, want {want:?}");
            if want == Encoding::PLAIN {
                assert!(
                    !enc.contains(&Encoding::DELTA_BINARY_PACKED)
                        && !enc.contains(&Encoding::DELTA_BYTE_ARRAY)
                        && !enc.contains(&Encoding::RLE_DICTIONARY),
                    "{name}: {enc:?}"
                );
            }
            assert!(
                matches!(c.compression(), Compression::ZSTD(_)),
                "{name}: {:?}",
                c.compression()
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_empty_table_still_has_a_readable_file() {
        let dir = crate::writer::tests::tempdir("ldb-table-empty");
        let w = TableWriter::new(&dir, "functions", COLS, &[], &[]).unwrap();
        let s = w.finish().unwrap();
        assert_eq!((s.rows, s.files.len()), (0, 1));
        let f = File::open(dir.join(&s.files[0])).unwrap();
        let b = ParquetRecordBatchReaderBuilder::try_new(f).unwrap();
        assert_eq!(b.schema().fields().len(), COLS.len());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
