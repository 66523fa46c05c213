//! The Workload API's messages (`proto/workload.proto`), generated from it by prost-build into
//! `proto/workload.rs` (checked in; `scripts/protos` writes it, and `.ci/run` fails when it is not what the
//! proto makes). The service has no proto package, so its method paths are `/SpiffeWorkloadAPI/<Method>`
//! ([`paths`]).

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

/// The messages, as prost-build writes them from the proto (documented there); prost spells `SVID` as
/// `svid`, and the aliases below give them the names the rest of meshca uses. The incubating WIT-SVID
/// messages are generated too and unused (those methods are answered `UNIMPLEMENTED`).
#[allow(missing_docs, dead_code, clippy::all, clippy::pedantic)]
mod generated {
    include!("proto/workload.rs");
}

pub use generated::{
    JwtBundlesRequest, JwtBundlesResponse, Jwtsvid as JwtSvid, JwtsvidRequest as JwtSvidRequest,
    JwtsvidResponse as JwtSvidResponse, ValidateJwtsvidRequest as ValidateJwtSvidRequest,
    ValidateJwtsvidResponse as ValidateJwtSvidResponse, X509BundlesRequest, X509BundlesResponse,
    X509svid as X509Svid, X509svidRequest as X509SvidRequest, X509svidResponse as X509SvidResponse,
};

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

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
