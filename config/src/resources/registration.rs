//! `type: WorkloadRegistration`: which processes on a host get a Dataplane's identity from the Workload
//! API, picked by the selectors the kernel gives for them.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::error::{Report, Source};
use super::Labels;
use crate::names::{check_name, cut, ECHO_CHARS};
use crate::{Duration, Selector};

/// `spec.jwtSvid.expiry` unless set: five minutes.
pub const DEFAULT_JWT_SVID_EXPIRY: std::time::Duration = std::time::Duration::from_secs(5 * 60);

/// The longest `spec.jwtSvid.expiry` accepted: a day.
pub const MAX_JWT_SVID_EXPIRY: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// The longest `spec.hint` accepted, in bytes.
pub const MAX_HINT_BYTES: usize = 1024;

/// A WorkloadRegistration resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkloadRegistration {
    /// The resource name.
    pub name: String,
    /// The mesh it belongs to.
    pub mesh: String,
    /// `labels`.
    pub labels: Labels,
    /// `spec.dataplane`: the Dataplane of this mesh whose identity a matching caller gets (it exists,
    /// once loaded through [`super::Resources`]).
    pub dataplane: String,
    /// `spec.selectors`: never empty, no repeats, in the order written. A caller matches when it has
    /// every one of them.
    pub selectors: Vec<Selector>,
    /// `spec.agent`: the `meshca agent` whose host runs the workload; `None` for the server's own socket.
    pub agent: Option<String>,
    /// `spec.hint`: non-empty, printable, at most [`MAX_HINT_BYTES`] bytes.
    pub hint: Option<String>,
    /// `spec.jwtSvid.expiry`: the lifetime of the JWT-SVIDs signed for it, in (0, 24h] (default 5m).
    pub jwt_svid_expiry: std::time::Duration,
    /// Where it was defined.
    pub source: Source,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RegistrationSpec {
    dataplane: Option<String>,
    selectors: Option<Vec<String>>,
    agent: Option<String>,
    hint: Option<String>,
    jwt_svid: Option<RawJwtSvid>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawJwtSvid {
    expiry: Option<String>,
}

impl RegistrationSpec {
    pub(super) fn into_typed(
        self,
        name: String,
        mesh: String,
        labels: Labels,
        report: &mut Report,
    ) -> Option<WorkloadRegistration> {
        let dataplane = match self.dataplane {
            Some(dataplane) => match check_name(&dataplane) {
                Ok(()) => Some(dataplane),
                Err(e) => {
                    report.error("spec.dataplane", e.to_string());
                    None
                }
            },
            None => {
                report.error(
                    "spec.dataplane",
                    "required: the Dataplane of this mesh whose identity matching callers get",
                );
                None
            }
        };
        let selectors = selectors(self.selectors, report);
        if let Some(agent) = &self.agent {
            if let Err(e) = check_name(agent) {
                report.error("spec.agent", e.to_string());
            }
        }
        if let Some(hint) = &self.hint {
            check_hint(hint, report);
        }
        let jwt_svid_expiry = jwt_svid_expiry(self.jwt_svid.and_then(|j| j.expiry), report);
        Some(WorkloadRegistration {
            name,
            mesh,
            labels,
            dataplane: dataplane?,
            selectors,
            agent: self.agent,
            hint: self.hint,
            jwt_svid_expiry: jwt_svid_expiry?,
            source: report.source.clone(),
        })
    }
}

/// `spec.selectors`, each parsed; every bad or repeated one is reported under its index.
fn selectors(raw: Option<Vec<String>>, report: &mut Report) -> Vec<Selector> {
    let Some(raw) = raw else {
        report.error(
            "spec.selectors",
            "required: the selectors a caller must all have, such as [unix:uid:1001]",
        );
        return Vec::new();
    };
    if raw.is_empty() {
        report.error(
            "spec.selectors",
            "at least one selector is required (an empty list would match every caller)",
        );
    }
    let mut first: BTreeMap<Selector, usize> = BTreeMap::new();
    let mut selectors = Vec::with_capacity(raw.len());
    for (i, text) in raw.iter().enumerate() {
        let field = format!("spec.selectors[{i}]");
        match text.parse::<Selector>() {
            Err(e) => report.error(field, e.to_string()),
            Ok(selector) => {
                if let Some(earlier) = first.get(&selector) {
                    report.error(
                        field,
                        format!("{selector} is listed twice (also spec.selectors[{earlier}])"),
                    );
                } else {
                    first.insert(selector.clone(), i);
                    selectors.push(selector);
                }
            }
        }
    }
    selectors
}

fn check_hint(hint: &str, report: &mut Report) {
    if hint.is_empty() {
        report.error("spec.hint", "must not be empty; remove it to set none");
    } else if hint.len() > MAX_HINT_BYTES {
        report.error(
            "spec.hint",
            format!(
                "{:?} is {} bytes long; at most {MAX_HINT_BYTES} are allowed",
                cut(hint, ECHO_CHARS),
                hint.len()
            ),
        );
    } else if hint.chars().any(char::is_control) {
        report.error(
            "spec.hint",
            format!(
                "{:?} holds a control character; a hint must be printable",
                cut(hint, ECHO_CHARS)
            ),
        );
    }
}

fn jwt_svid_expiry(raw: Option<String>, report: &mut Report) -> Option<std::time::Duration> {
    const FIELD: &str = "spec.jwtSvid.expiry";
    let Some(text) = raw else {
        return Some(DEFAULT_JWT_SVID_EXPIRY);
    };
    match text.parse::<Duration>() {
        Ok(d) if d.as_std().is_zero() => {
            report.error(FIELD, "must be greater than zero");
            None
        }
        Ok(d) if d.as_std() > MAX_JWT_SVID_EXPIRY => {
            report.error(
                FIELD,
                format!(
                    "{} is longer than a day (24h), the longest a JWT-SVID may live",
                    cut(&text, ECHO_CHARS)
                ),
            );
            None
        }
        Ok(d) => Some(d.as_std()),
        Err(e) => {
            report.error(FIELD, e.to_string());
            None
        }
    }
}
