//! Human- and machine-readable views of secrets, without their private keys.

use std::collections::BTreeMap;

use envoy_types::pb::envoy::config::core::v3::{data_source::Specifier, DataSource};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    secret, CertificateValidationContext, Secret, SpiffeCertValidatorConfig,
};
use envoy_types::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern;
use prost::Message;

use crate::secret::SPIFFE_VALIDATOR_NAME;
use meshca_control::SecretPem;

/// What a secret holds, safe to print: private keys are replaced by `[redacted]`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SecretView {
    /// The resource name.
    pub name: String,
    /// The content.
    #[serde(flatten)]
    pub kind: SecretKindView,
}

/// The content of a secret.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum SecretKindView {
    /// An identity: certificate chain and (hidden) key.
    TlsCertificate {
        /// The leaf followed by intermediates, PEM.
        certificate_chain_pem: String,
        /// Always `[redacted]`.
        private_key: String,
    },
    /// A validation context.
    ValidationContext {
        /// Plain form: every trusted CA, PEM.
        #[serde(skip_serializing_if = "Option::is_none")]
        trusted_ca_pem: Option<String>,
        /// SPIFFE validator form: trust domain → CA PEMs.
        #[serde(skip_serializing_if = "Option::is_none")]
        spiffe_trust_domains: Option<BTreeMap<String, String>>,
        /// Exact URI SANs a peer must present (MeshService contexts).
        subject_alt_names: Vec<String>,
    },
    /// Something meshca never serves (session ticket keys, generic secrets, empty).
    Other {
        /// What it is.
        description: String,
    },
}

/// Describes a secret without its private key.
pub fn describe(secret: &Secret) -> SecretView {
    let kind = match &secret.r#type {
        Some(secret::Type::TlsCertificate(cert)) => SecretKindView::TlsCertificate {
            certificate_chain_pem: cert
                .certificate_chain
                .as_ref()
                .and_then(inline_text)
                .unwrap_or_default(),
            private_key: "[redacted]".to_owned(),
        },
        Some(secret::Type::ValidationContext(context)) => describe_validation(context),
        Some(secret::Type::SessionTicketKeys(_)) => SecretKindView::Other {
            description: "session ticket keys".into(),
        },
        Some(secret::Type::GenericSecret(_)) => SecretKindView::Other {
            description: "generic secret".into(),
        },
        None => SecretKindView::Other {
            description: "empty secret".into(),
        },
    };
    SecretView {
        name: secret.name.clone(),
        kind,
    }
}

fn describe_validation(context: &CertificateValidationContext) -> SecretKindView {
    let trusted_ca_pem = context.trusted_ca.as_ref().and_then(inline_text);
    let spiffe_trust_domains = context
        .custom_validator_config
        .as_ref()
        .filter(|config| config.name == SPIFFE_VALIDATOR_NAME)
        .and_then(|config| config.typed_config.as_ref())
        .and_then(|any| SpiffeCertValidatorConfig::decode(any.value.as_slice()).ok())
        .map(|config| {
            config
                .trust_domains
                .iter()
                .map(|domain| {
                    let pem = domain
                        .trust_bundle
                        .as_ref()
                        .and_then(inline_text)
                        .unwrap_or_default();
                    (domain.name.clone(), pem)
                })
                .collect()
        });
    let subject_alt_names = context
        .match_typed_subject_alt_names
        .iter()
        .filter_map(
            |matcher| match matcher.matcher.as_ref()?.match_pattern.as_ref()? {
                MatchPattern::Exact(value) => Some(value.clone()),
                _ => None,
            },
        )
        .collect();
    SecretKindView::ValidationContext {
        trusted_ca_pem,
        spiffe_trust_domains,
        subject_alt_names,
    }
}

fn inline_text(source: &DataSource) -> Option<String> {
    match source.specifier.as_ref()? {
        Specifier::InlineString(text) => Some(text.clone()),
        Specifier::InlineBytes(bytes) => String::from_utf8(bytes.clone()).ok(),
        _ => None,
    }
}

/// The certificate chain and private key of an identity secret (for `meshca issue`).
pub fn tls_certificate_parts(secret: &Secret) -> Option<(String, SecretPem)> {
    let Some(secret::Type::TlsCertificate(cert)) = &secret.r#type else {
        return None;
    };
    let chain = cert.certificate_chain.as_ref().and_then(inline_text)?;
    let key = cert.private_key.as_ref().and_then(inline_text)?;
    Some((chain, SecretPem::new(key)))
}
