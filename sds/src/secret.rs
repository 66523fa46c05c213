//! Building Envoy `Secret` protos and their content versions.
//!
//! A validation context is encoded once per bundle and form, then shared: each response
//! only prepends the asked name. Identity secrets carry a private key and are built on
//! demand, never cached.

use std::sync::{Arc, Mutex, OnceLock};

use envoy_types::pb::envoy::config::core::v3::{
    data_source::Specifier, DataSource, TypedExtensionConfig,
};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    secret, spiffe_cert_validator_config::TrustDomain, subject_alt_name_matcher::SanType,
    CertificateValidationContext, Secret, SpiffeCertValidatorConfig, SubjectAltNameMatcher,
    TlsCertificate,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{string_matcher::MatchPattern, StringMatcher};
use envoy_types::pb::google::protobuf::Any;
use meshca_control::{Derived, LeafKey, MeshServiceTrust, ProxyIdentity, TrustBundle};
use prost::{Message, Name};
use zeroize::Zeroize;

/// Name of Envoy's SPIFFE certificate validator extension.
pub const SPIFFE_VALIDATOR_NAME: &str = "envoy.tls.cert_validator.spiffe";

/// Type URL of the `Any` resources SDS sends.
pub const SECRET_TYPE_URL: &str =
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";

/// Checks a request's type URL: empty (Envoy may omit it) or the secret type.
pub(crate) fn check_type_url(type_url: &str) -> Result<(), tonic::Status> {
    if type_url.is_empty() || type_url == SECRET_TYPE_URL {
        return Ok(());
    }
    Err(tonic::Status::invalid_argument(format!(
        "this is a secret discovery service: type_url must be {SECRET_TYPE_URL:?}, not {type_url:?}"
    )))
}

/// How a validation context expresses its trust.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Form {
    /// Envoy's SPIFFE validator, one bundle per trust domain.
    Spiffe,
    /// Plain `trusted_ca`, every PEM concatenated.
    Plain,
}

/// Encoded validation contexts, built on first use, one per form.
#[derive(Default)]
pub(crate) struct ValidationCache {
    spiffe: OnceLock<Arc<EncodedSecret>>,
    plain: OnceLock<Arc<EncodedSecret>>,
}

impl ValidationCache {
    /// The encoded context of `form` kept in `derived`, built on first use. Built afresh (and not
    /// kept) if `derived` holds something else, which no code of meshca puts there.
    fn get_or_build(
        derived: &Derived,
        form: Form,
        build: impl FnOnce() -> CertificateValidationContext,
    ) -> Arc<EncodedSecret> {
        let encode = || Arc::new(EncodedSecret::validation(build()));
        let Some(cache) = derived.get_or_default::<ValidationCache>() else {
            return encode();
        };
        let cell = match form {
            Form::Spiffe => &cache.spiffe,
            Form::Plain => &cache.plain,
        };
        cell.get_or_init(encode).clone()
    }
}

/// A `Secret` encoded without its name, plus the version of its content.
#[derive(Debug)]
pub(crate) struct EncodedSecret {
    body: Vec<u8>,
    version: String,
    /// Whole responses carrying this secret alone, by the name it was asked under: the streams that
    /// ask for it by that name share one encoding.
    alone: Mutex<Vec<(Box<str>, Arc<SharedResponse>)>>,
}

/// A response encoded once, without the nonce each stream adds, and its version.
#[derive(Debug)]
pub(crate) struct SharedResponse {
    pub version: String,
    pub encoded: Vec<u8>,
}

/// How many names one secret keeps a shared response for: the names that mean the same trust are
/// few (`system_trust_bundle`, `ROOTCA`, `system_trust_bundle_<mesh>`...); past these, responses are
/// built per stream.
const SHARED_NAMES: usize = 8;

impl EncodedSecret {
    fn validation(context: CertificateValidationContext) -> Self {
        let body = Secret {
            name: String::new(),
            r#type: Some(secret::Type::ValidationContext(context)),
        }
        .encode_to_vec();
        let version = content_version(b"validation_context", &body);
        Self {
            body,
            version,
            alone: Mutex::new(Vec::new()),
        }
    }

    /// The response carrying this secret alone under `name`, built by `build` on first use and
    /// kept for the next streams that ask by that name (`None` when this secret keeps as many as it
    /// may: then the stream builds its own).
    pub(crate) fn alone(
        &self,
        name: &str,
        build: impl FnOnce() -> SharedResponse,
    ) -> Option<Arc<SharedResponse>> {
        let mut alone = self.alone.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, shared)) = alone.iter().find(|(n, _)| &**n == name) {
            return Some(shared.clone());
        }
        if alone.len() >= SHARED_NAMES {
            return None;
        }
        let shared = Arc::new(build());
        alone.push((name.into(), shared.clone()));
        Some(shared)
    }

    pub(crate) fn version(&self) -> &str {
        &self.version
    }

    /// The secret named `name`, packed as a response resource. Protobuf merges
    /// concatenated encodings, so the name's encoding followed by the body is the whole
    /// message.
    pub(crate) fn to_any(&self, name: &str) -> Any {
        let mut value = Secret {
            name: name.to_owned(),
            r#type: None,
        }
        .encode_to_vec();
        value.extend_from_slice(&self.body);
        Any {
            type_url: SECRET_TYPE_URL.to_owned(),
            value,
        }
    }
}

/// The validation context of `bundle` in `form`, cached in the bundle.
pub(crate) fn bundle_secret(bundle: &TrustBundle, form: Form) -> Arc<EncodedSecret> {
    ValidationCache::get_or_build(bundle.derived(), form, || validation_context(bundle, form))
}

/// The one SAN matcher of a `meshservice:` context whose service has no identity yet. Envoy treats an
/// empty matcher list as "any SAN", which would let every workload of the mesh pass as the service; this
/// URI is no SPIFFE ID, so no certificate meshca issues carries it and the context accepts nobody.
pub const NO_IDENTITY_SAN: &str = "meshca:no-identity-yet";

/// The validation context of a MeshService in `form`, cached in it.
pub(crate) fn mesh_service_secret(service: &MeshServiceTrust, form: Form) -> Arc<EncodedSecret> {
    ValidationCache::get_or_build(service.derived(), form, || {
        let mut context = validation_context(service.trust(), form);
        let none = [NO_IDENTITY_SAN.to_owned()];
        let ids: Vec<&String> = if service.spiffe_ids().is_empty() {
            none.iter().collect()
        } else {
            service.spiffe_ids().iter().collect()
        };
        context.match_typed_subject_alt_names = ids
            .into_iter()
            .map(|id| SubjectAltNameMatcher {
                san_type: SanType::Uri as i32,
                matcher: Some(StringMatcher {
                    ignore_case: false,
                    match_pattern: Some(MatchPattern::Exact(id.clone())),
                }),
                oid: String::new(),
            })
            .collect();
        context
    })
}

fn validation_context(bundle: &TrustBundle, form: Form) -> CertificateValidationContext {
    match form {
        Form::Plain => {
            let all = bundle.by_trust_domain().values().flatten();
            CertificateValidationContext {
                trusted_ca: Some(inline(concat_pems(all))),
                ..Default::default()
            }
        }
        Form::Spiffe => {
            let trust_domains = bundle
                .by_trust_domain()
                .iter()
                .map(|(name, pems)| TrustDomain {
                    name: name.clone(),
                    trust_bundle: Some(inline(concat_pems(pems))),
                    workload_trust_domain: String::new(),
                })
                .collect();
            let config = SpiffeCertValidatorConfig {
                trust_domains,
                trust_bundles: None,
            };
            CertificateValidationContext {
                custom_validator_config: Some(TypedExtensionConfig {
                    name: SPIFFE_VALIDATOR_NAME.to_owned(),
                    typed_config: Some(Any {
                        type_url: SpiffeCertValidatorConfig::type_url(),
                        value: config.encode_to_vec(),
                    }),
                }),
                ..Default::default()
            }
        }
    }
}

/// Concatenates PEM blocks, making sure each ends with a newline.
fn concat_pems<'a>(pems: impl IntoIterator<Item = &'a String>) -> String {
    let mut out = String::new();
    for pem in pems {
        out.push_str(pem.trim_end());
        out.push('\n');
    }
    out
}

fn inline(text: String) -> DataSource {
    DataSource {
        watched_directory: None,
        specifier: Some(Specifier::InlineString(text)),
    }
}

/// The version of an identity secret: a hash of the certificate chain only. The key is
/// never hashed; it changes exactly when the chain does.
pub(crate) fn identity_version(identity: &ProxyIdentity) -> String {
    content_version(b"tls_certificate", identity.chain_pem.as_bytes())
}

/// An identity whose private key meshca does not hold (a `meshca agent` made it and keeps it on its
/// host): SDS has no key to serve with its certificate, and never sends a certificate without one.
#[derive(Debug, Clone, thiserror::Error)]
#[error("the identity {spiffe_id} is certified over a key that a meshca agent holds on its host: SDS has no private key to serve with it")]
pub(crate) struct KeylessIdentity {
    /// The identity's SPIFFE ID.
    pub spiffe_id: String,
}

/// The identity secret named `name`. Built per response: a private key is never cached. An identity
/// whose key an agent holds is refused, never sent without its key.
pub(crate) fn identity_any(name: &str, identity: &ProxyIdentity) -> Result<Any, KeylessIdentity> {
    let key = match &identity.key {
        LeafKey::Held(key) => key,
        LeafKey::Agent(_) => {
            return Err(KeylessIdentity {
                spiffe_id: identity.spiffe_id.clone(),
            })
        }
    };
    let mut message = Secret {
        name: name.to_owned(),
        r#type: Some(secret::Type::TlsCertificate(TlsCertificate {
            certificate_chain: Some(inline(identity.chain_pem.clone())),
            private_key: Some(inline(key.expose().to_owned())),
            ..Default::default()
        })),
    };
    let value = message.encode_to_vec();
    wipe_private_key(&mut message);
    Ok(Any {
        type_url: SECRET_TYPE_URL.to_owned(),
        value,
    })
}

/// Zeroizes the key copy held by a `Secret` before it is dropped.
pub(crate) fn wipe_private_key(message: &mut Secret) {
    if let Some(secret::Type::TlsCertificate(cert)) = &mut message.r#type {
        match cert
            .private_key
            .as_mut()
            .and_then(|key| key.specifier.as_mut())
        {
            Some(Specifier::InlineString(key)) => key.zeroize(),
            Some(Specifier::InlineBytes(key)) => key.zeroize(),
            _ => {}
        }
    }
}

/// The length of every version meshca gives a secret: hex digits of a content hash.
pub(crate) const VERSION_LEN: usize = 32;

/// A short, stable hex hash of `kind` and `content`, [`VERSION_LEN`] digits.
pub(crate) fn content_version(kind: &[u8], content: &[u8]) -> String {
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    context.update(&(kind.len() as u64).to_be_bytes());
    context.update(kind);
    context.update(content);
    hex::encode(&context.finish().as_ref()[..VERSION_LEN / 2])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared(version: &str) -> SharedResponse {
        SharedResponse {
            version: version.into(),
            encoded: version.as_bytes().to_vec(),
        }
    }

    /// Streams asking for a secret by the same name share one response; each name has its own, up to
    /// a bound past which streams build their own.
    #[test]
    fn a_secret_shares_one_response_per_name_up_to_a_bound() {
        let secret = EncodedSecret::validation(CertificateValidationContext::default());
        let first = secret.alone("ROOTCA", || shared("a")).expect("kept");
        let again = secret
            .alone("ROOTCA", || unreachable!("built once"))
            .expect("kept");
        assert!(Arc::ptr_eq(&first, &again));
        let other = secret
            .alone("system_trust_bundle", || shared("b"))
            .expect("kept");
        assert_eq!(other.version, "b");
        for i in 2..SHARED_NAMES {
            assert!(secret.alone(&format!("n-{i}"), || shared("c")).is_some());
        }
        assert!(secret.alone("one-too-many", || shared("d")).is_none());
        assert!(
            secret.alone("ROOTCA", || shared("e")).is_some(),
            "kept ones stay"
        );
    }
}
