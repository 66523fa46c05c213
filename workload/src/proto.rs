//! The Workload API's messages (`proto/workload.proto`), transcribed into prost types.
//!
//! The field numbers and types are the proto's; see `proto/README.md` for why they are written here
//! rather than generated. The service has no proto package, so its method paths are
//! `/SpiffeWorkloadAPI/<Method>` ([`paths`]).

use std::collections::HashMap;

/// `google.protobuf.Struct` and its values, which `ValidateJwtSvidResponse::claims` holds.
pub use envoy_types::pb::google::protobuf::{value, ListValue, Struct, Value};

/// The method paths of `SpiffeWorkloadAPI`.
pub mod paths {
    /// Server streaming: `X509SVIDRequest` → `X509SVIDResponse`.
    pub const FETCH_X509_SVID: &str = "/SpiffeWorkloadAPI/FetchX509SVID";
    /// Server streaming: `X509BundlesRequest` → `X509BundlesResponse`.
    pub const FETCH_X509_BUNDLES: &str = "/SpiffeWorkloadAPI/FetchX509Bundles";
    /// Unary: `JWTSVIDRequest` → `JWTSVIDResponse`.
    pub const FETCH_JWT_SVID: &str = "/SpiffeWorkloadAPI/FetchJWTSVID";
    /// Server streaming: `JWTBundlesRequest` → `JWTBundlesResponse`.
    pub const FETCH_JWT_BUNDLES: &str = "/SpiffeWorkloadAPI/FetchJWTBundles";
    /// Unary: `ValidateJWTSVIDRequest` → `ValidateJWTSVIDResponse`.
    pub const VALIDATE_JWT_SVID: &str = "/SpiffeWorkloadAPI/ValidateJWTSVID";
    /// Incubating WIT-SVID profile (answered `UNIMPLEMENTED`).
    pub const FETCH_WIT_SVID: &str = "/SpiffeWorkloadAPI/FetchWITSVID";
    /// Incubating WIT-SVID profile (answered `UNIMPLEMENTED`).
    pub const FETCH_WIT_BUNDLES: &str = "/SpiffeWorkloadAPI/FetchWITBundles";
}

/// `X509SVIDRequest`: no parameters.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct X509SvidRequest {}

/// `X509SVIDResponse`: every X.509-SVID the caller is entitled to, and the foreign trust domains'
/// bundles.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct X509SvidResponse {
    /// The SVIDs; the first is the caller's default identity.
    #[prost(message, repeated, tag = "1")]
    pub svids: Vec<X509Svid>,
    /// DER certificate revocation lists (meshca sends none).
    #[prost(bytes = "vec", repeated, tag = "2")]
    pub crl: Vec<Vec<u8>>,
    /// Concatenated DER CA certificates per foreign trust domain, keyed `spiffe://<trust domain>`.
    #[prost(map = "string, bytes", tag = "3")]
    pub federated_bundles: HashMap<String, Vec<u8>>,
}

/// `X509SVID`: one SVID with its key and its trust domain's bundle.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct X509Svid {
    /// The SPIFFE ID in the certificate.
    #[prost(string, tag = "1")]
    pub spiffe_id: String,
    /// The DER chain, leaf first.
    #[prost(bytes = "vec", tag = "2")]
    pub x509_svid: Vec<u8>,
    /// The leaf's private key, unencrypted PKCS#8 DER.
    #[prost(bytes = "vec", tag = "3")]
    pub x509_svid_key: Vec<u8>,
    /// Concatenated DER CA certificates of the SVID's trust domain.
    #[prost(bytes = "vec", tag = "4")]
    pub bundle: Vec<u8>,
    /// The operator's hint on what the SVID is for; unique within one response.
    #[prost(string, tag = "5")]
    pub hint: String,
}

/// `X509BundlesRequest`: no parameters.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct X509BundlesRequest {}

/// `X509BundlesResponse`: every trust domain's X.509 bundle.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct X509BundlesResponse {
    /// DER certificate revocation lists (meshca sends none).
    #[prost(bytes = "vec", repeated, tag = "1")]
    pub crl: Vec<Vec<u8>>,
    /// Concatenated DER CA certificates per trust domain, keyed `spiffe://<trust domain>`.
    #[prost(map = "string, bytes", tag = "2")]
    pub bundles: HashMap<String, Vec<u8>>,
}

/// `JWTSVIDRequest`.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct JwtSvidRequest {
    /// The audiences the token is for; at least one.
    #[prost(string, repeated, tag = "1")]
    pub audience: Vec<String>,
    /// Only the SVID of this SPIFFE ID, when set.
    #[prost(string, tag = "2")]
    pub spiffe_id: String,
}

/// `JWTSVIDResponse`.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct JwtSvidResponse {
    /// The tokens.
    #[prost(message, repeated, tag = "1")]
    pub svids: Vec<JwtSvid>,
}

/// `JWTSVID`.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct JwtSvid {
    /// The token's subject.
    #[prost(string, tag = "1")]
    pub spiffe_id: String,
    /// The token, JWS compact serialization.
    #[prost(string, tag = "2")]
    pub svid: String,
    /// The operator's hint.
    #[prost(string, tag = "3")]
    pub hint: String,
}

/// `JWTBundlesRequest`: no parameters.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct JwtBundlesRequest {}

/// `JWTBundlesResponse`.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct JwtBundlesResponse {
    /// A JWK Set (JSON) per trust domain, keyed `spiffe://<trust domain>`.
    #[prost(map = "string, bytes", tag = "1")]
    pub bundles: HashMap<String, Vec<u8>>,
}

/// `ValidateJWTSVIDRequest`.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct ValidateJwtSvidRequest {
    /// The validating party's audience; the token's `aud` must hold it.
    #[prost(string, tag = "1")]
    pub audience: String,
    /// The token.
    #[prost(string, tag = "2")]
    pub svid: String,
}

/// `ValidateJWTSVIDResponse`.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct ValidateJwtSvidResponse {
    /// The token's subject.
    #[prost(string, tag = "1")]
    pub spiffe_id: String,
    /// The token's claims.
    #[prost(message, optional, tag = "2")]
    pub claims: Option<Struct>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    /// The encoding of a response written by hand from the proto's field numbers and wire types: a
    /// transcription error in a tag or a type would change these bytes.
    #[test]
    fn an_x509_response_encodes_with_the_protos_field_numbers() {
        let response = X509SvidResponse {
            svids: vec![X509Svid {
                spiffe_id: "a".into(),
                x509_svid: vec![1],
                x509_svid_key: vec![2],
                bundle: vec![3],
                hint: "h".into(),
            }],
            crl: vec![],
            federated_bundles: HashMap::from([("t".to_owned(), vec![4])]),
        };
        let svid = [
            0x0a, 1, b'a', // 1: spiffe_id
            0x12, 1, 1, // 2: x509_svid
            0x1a, 1, 2, // 3: x509_svid_key
            0x22, 1, 3, // 4: bundle
            0x2a, 1, b'h', // 5: hint
        ];
        let entry = [0x0a, 1, b't', 0x12, 1, 4]; // map entry: 1 key, 2 value
        let mut expected = vec![0x0a, svid.len() as u8];
        expected.extend_from_slice(&svid);
        expected.extend_from_slice(&[0x1a, entry.len() as u8]);
        expected.extend_from_slice(&entry);
        assert_eq!(response.encode_to_vec(), expected);
    }

    #[test]
    fn a_jwt_request_decodes_with_the_protos_field_numbers() {
        let bytes = [0x0a, 2, b'a', b'1', 0x0a, 1, b'b', 0x12, 1, b's'];
        let request = JwtSvidRequest::decode(&bytes[..]).expect("decodes");
        assert_eq!(request.audience, ["a1", "b"]);
        assert_eq!(request.spiffe_id, "s");
    }
}
