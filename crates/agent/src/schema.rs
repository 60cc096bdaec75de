//! `schema/recording.json`, the one definition of the recording format,
//! compiled into the agent. The writer's columns are declared in Rust
//! (`writer::COLUMNS`); tests pin them to this file, and the agent copies
//! `schema_version` and `meta_required` from it rather than restating them.

use serde::Deserialize;

pub const RECORDING_JSON: &str = include_str!("../../../schema/recording.json");

#[derive(Debug, Deserialize)]
pub struct Recording {
    pub schema_version: u64,
    pub tables: Tables,
    pub meta_required: Vec<String>,
}

#[derive(Debug, Deserialize)]
pub struct Tables {
    pub requests: Vec<ColumnSpec>,
    /// LDB tables (`--functions`); pinned to `observer::*_COLUMNS`.
    pub functions: Vec<ColumnSpec>,
    pub locks: Vec<ColumnSpec>,
    pub request_events: Vec<ColumnSpec>,
}

#[derive(Debug, Deserialize, Clone, PartialEq, Eq)]
pub struct ColumnSpec {
    pub name: String,
    #[serde(rename = "type")]
    pub ty: String,
}

/// The parsed schema file. It is compiled in, so a parse failure is a build
/// defect caught by the tests, never a runtime condition.
pub fn recording() -> Recording {
    serde_json::from_str(RECORDING_JSON).expect("schema/recording.json is valid (pinned by tests)")
}

pub fn schema_version() -> u64 {
    recording().schema_version
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observer::{FUNCTION_COLUMNS, LOCK_COLUMNS, REQUEST_EVENT_COLUMNS};

    fn pairs(cols: &[ColumnSpec]) -> Vec<(String, String)> {
        cols.iter()
            .map(|c| (c.name.clone(), c.ty.clone()))
            .collect()
    }
    fn ours(cols: &[(&str, &str)]) -> Vec<(String, String)> {
        cols.iter()
            .map(|(n, t)| (n.to_string(), t.to_string()))
            .collect()
    }

    #[test]
    fn ldb_tables_are_recording_json() {
        let r = recording();
        assert_eq!(pairs(&r.tables.functions), ours(FUNCTION_COLUMNS));
        assert_eq!(pairs(&r.tables.locks), ours(LOCK_COLUMNS));
        assert_eq!(pairs(&r.tables.request_events), ours(REQUEST_EVENT_COLUMNS));
        for (_, t) in FUNCTION_COLUMNS
            .iter()
            .chain(LOCK_COLUMNS)
            .chain(REQUEST_EVENT_COLUMNS)
        {
            assert!(crate::writer::arrow_type(t).is_some(), "{t}");
        }
    }
}
