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
