//! The agent protocol of `meshca serve`: served beside SDS on its listeners, tuned by the `limits:`
//! settings, listed by `/api/agents`.

use meshca_agent_server::AgentOptions;
use meshca_config::Settings;

/// The agent protocol's options from the settings: agents make keys of the daemon's leaf key algorithm.
pub(crate) fn options(settings: &Settings) -> AgentOptions {
    let limits = &settings.limits;
    AgentOptions::new(settings.issuance.key_algorithm)
        .with_streams_per_agent(to_usize(limits.agent_streams_per_agent))
        .with_message_bytes(to_usize(limits.agent_message_bytes))
        .with_jwt_limits(
            to_usize(limits.jwt_audiences_per_request),
            to_usize(limits.jwt_audience_bytes),
            crate::workload_api::jwt_cache_limits(limits),
        )
        .with_warnings_per_minute(limits.warnings_per_minute)
}

fn to_usize(value: u32) -> usize {
    usize::try_from(value).unwrap_or(usize::MAX)
}
