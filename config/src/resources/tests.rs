//! Unit tests of the resource formats, one file per format.

mod cross;
mod dataplane;
mod federation;
mod header;
mod identity;
mod kuma_output;
mod mesh;
mod pkcs11;
mod registration;
mod service;
mod trust;

use std::path::Path;

use super::*;

const FILE: &str = "/r/test.yaml";

fn parse(text: &str) -> Result<Vec<Resource>, Vec<ResourceError>> {
    parse_str(Path::new(FILE), text)
}

/// The single resource of a valid document.
fn one(text: &str) -> Resource {
    match parse(text) {
        Ok(mut resources) if resources.len() == 1 => resources.remove(0),
        other => panic!("expected one resource, got {other:#?}"),
    }
}

/// The errors of an invalid document.
fn errors(text: &str) -> Vec<ResourceError> {
    match parse(text) {
        Ok(resources) => panic!("expected errors, got {resources:#?}"),
        Err(errors) => errors,
    }
}

/// The single error of an invalid document.
fn one_error(text: &str) -> ResourceError {
    let mut errors = errors(text);
    assert_eq!(errors.len(), 1, "expected one error, got {errors:#?}");
    errors.remove(0)
}

/// Asserts an error's field and that its message contains `message`.
#[track_caller]
fn assert_error(error: &ResourceError, field: &str, message: &str) {
    assert_eq!(error.field, field, "{error}");
    assert!(
        error.message.contains(message),
        "expected {message:?} in: {error}"
    );
}
