//! A generic Parquet table writer for the LDB tables (`functions`, `locks`,
//! `request_events`): columns declared as `(name, type)` pairs that tests pin
//! to `schema/recording.json`, rows buffered column-wise, a row group every
//! [`ROW_GROUP_ROWS`] rows, and the file rotated like the requests table
//! (hidden `.part-N.parquet.inprogress` until closed).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
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

/// One cell of a row.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell<'a> {
    U64(u64),
    U32(u32),
    Str(&'a str),
    Bool(bool),
}

enum Column {
    U64(Vec<u64>),
    U32(Vec<u32>),
    Str(Vec<String>),
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
    fn take(&mut self) -> ArrayRef {
        match self {
            Column::U64(v) => Arc::new(UInt64Array::from(std::mem::take(v))),
            Column::U32(v) => Arc::new(UInt32Array::from(std::mem::take(v))),
            Column::Str(v) => Arc::new(StringArray::from(std::mem::take(v))),
            Column::Bool(v) => Arc::new(BooleanArray::from(std::mem::take(v))),
        }
    }
}

pub struct TableWriter {
    dir: PathBuf,
    table_dir: PathBuf,
    table: &'static str,
    schema: SchemaRef,
    columns: Vec<Column>,
    rows_buffered: usize,
    file: Option<(ArrowWriter<File>, PathBuf, PathBuf, u64)>,
    next_index: u32,
    summary: WriterSummary,
    window_start: Option<Instant>,
    dictionary: &'static [&'static str],
    delta: &'static [&'static str],
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
        Ok(TableWriter {
            dir: dir.to_path_buf(),
            table_dir,
            table,
            schema: Arc::new(Schema::new(fields)),
            columns: columns.iter().map(|(_, t)| Column::new(t)).collect(),
            rows_buffered: 0,
            file: None,
            next_index: 0,
            summary: WriterSummary::default(),
            window_start: None,
            dictionary,
            delta,
        })
    }

    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// Appends a row; `row` must match the columns in order and type.
    pub fn push(&mut self, row: &[Cell<'_>]) -> Result<()> {
        debug_assert_eq!(row.len(), self.columns.len());
        for (col, cell) in self.columns.iter_mut().zip(row) {
            match (col, cell) {
                (Column::U64(v), Cell::U64(x)) => v.push(*x),
                (Column::U32(v), Cell::U32(x)) => v.push(*x),
                (Column::Str(v), Cell::Str(x)) => v.push((*x).to_string()),
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
        self.summary.rows += 1;
        if self.window_start.is_none() {
            self.window_start = Some(Instant::now());
        }
        if self.rows_buffered >= ROW_GROUP_ROWS {
            self.flush_row_group()?;
        }
        Ok(())
    }

    pub fn rows(&self) -> u64 {
        self.summary.rows
    }

    /// Bytes on disk so far (closed files plus the open one's flushed part).
    pub fn bytes_written(&self) -> u64 {
        self.summary.bytes + self.file.as_ref().map_or(0, |f| f.0.bytes_written() as u64)
    }

    pub fn tick(&mut self, now: Instant) -> Result<()> {
        if self
            .window_start
            .is_some_and(|t| now.duration_since(t) >= ROTATE_AFTER)
        {
            self.flush_row_group()?;
            self.close_file()?;
        }
        Ok(())
    }

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
        b.build()
    }

    fn flush_row_group(&mut self) -> Result<()> {
        if self.rows_buffered == 0 {
            return Ok(());
        }
        let arrays: Vec<ArrayRef> = self.columns.iter_mut().map(Column::take).collect();
        self.rows_buffered = 0;
        let batch = RecordBatch::try_new(self.schema.clone(), arrays)
            .map_err(|e| AgentError::internal(format!("building a row group: {e}")))?;
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
        let (w, tmp, _, rows) = self.file.as_mut().expect("just opened");
        *rows += batch.num_rows() as u64;
        w.write(&batch)
            .and_then(|_| w.flush())
            .map_err(|e| io_err("cannot write", tmp, e))?;
        if *rows >= ROTATE_ROWS {
            self.close_file()?;
        }
        Ok(())
    }

    fn close_file(&mut self) -> Result<()> {
        self.window_start = None;
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
        let rel = final_path
            .strip_prefix(&self.dir)
            .unwrap_or(&final_path)
            .to_string_lossy()
            .into_owned();
        self.summary.files.push(rel);
        Ok(())
    }

    /// Writes what is buffered and closes the file; an empty table still
    /// gets one file so that readers see its schema.
    pub fn finish(mut self) -> Result<WriterSummary> {
        self.flush_row_group()?;
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
