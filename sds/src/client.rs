//! An SDS client that speaks like Envoy: used by `meshca sds fetch`, `meshca issue
//! --server`, drills and tests.

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::Secret;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::envoy::service::secret::v3::secret_discovery_service_client::SecretDiscoveryServiceClient;
use envoy_types::pb::google::protobuf::Struct;
use envoy_types::pb::google::rpc::Status as RpcStatus;
use futures::Stream;
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::Channel;

use meshca_serve::{connect_channel, ClientTls};

use crate::error::ClientError;
use crate::secret::{wipe_private_key, SECRET_TYPE_URL};

/// A connected SDS client authenticated with a proxy token.
#[derive(Debug, Clone)]
pub struct SdsClient {
    inner: SecretDiscoveryServiceClient<Channel>,
    authorization: MetadataValue<Ascii>,
}

impl SdsClient {
    /// Connects to `target` (`unix:///path` or `host:port`; TLS when `tls` is given).
    pub async fn connect(
        target: &str,
        tls: Option<ClientTls>,
        token: String,
    ) -> Result<Self, ClientError> {
        let channel = connect_channel(target, tls).await?;
        Self::with_channel(channel, &token)
    }

    /// A client for `token` over an existing channel: several proxies' clients may share one
    /// HTTP/2 connection, each stream carrying its own token.
    pub fn with_channel(channel: Channel, token: &str) -> Result<Self, ClientError> {
        let authorization = MetadataValue::try_from(format!("Bearer {}", token.trim()))
            .map_err(|_| ClientError::InvalidToken)?;
        Ok(Self {
            inner: SecretDiscoveryServiceClient::new(channel),
            authorization,
        })
    }

    /// Opens a `StreamSecrets` stream subscribed to `names` and leaves it to the caller: send
    /// ACKs, NACKs and new subscriptions on the returned sender (queue of `depth` requests),
    /// read responses from the returned stream. [`SdsClient::stream`] is the Envoy-like
    /// automatic version.
    pub async fn open_stream(
        &self,
        node_id: &str,
        names: &[String],
        metadata: Option<Struct>,
        depth: usize,
    ) -> Result<
        (
            mpsc::Sender<DiscoveryRequest>,
            tonic::Streaming<DiscoveryResponse>,
        ),
        ClientError,
    > {
        let node = Node {
            id: node_id.to_owned(),
            metadata,
            ..Default::default()
        };
        self.open_stream_as(node, names, depth).await
    }

    /// [`Self::open_stream`] with the whole node of the first request given, as Envoy sends it
    /// (build version, extension list).
    pub async fn open_stream_as(
        &self,
        node: Node,
        names: &[String],
        depth: usize,
    ) -> Result<
        (
            mpsc::Sender<DiscoveryRequest>,
            tonic::Streaming<DiscoveryResponse>,
        ),
        ClientError,
    > {
        let (tx, rx) = mpsc::channel(depth.max(1));
        // The channel was just created with room to spare; it cannot be full or closed.
        tx.try_send(DiscoveryRequest {
            node: Some(node),
            resource_names: names.to_vec(),
            type_url: SECRET_TYPE_URL.to_owned(),
            ..Default::default()
        })
        .map_err(|_| ClientError::InvalidResponse {
            reason: "internal: request queue unavailable".into(),
        })?;
        let responses = self
            .inner
            .clone()
            .stream_secrets(self.request(ReceiverStream::new(rx)))
            .await?
            .into_inner();
        Ok((tx, responses))
    }

    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request
            .metadata_mut()
            .insert("authorization", self.authorization.clone());
        request
    }

    /// `FetchSecrets`: every name in `names`, or an error naming the missing one.
    pub async fn fetch(
        &mut self,
        node_id: &str,
        names: &[String],
        metadata: Option<Struct>,
    ) -> Result<Vec<Secret>, ClientError> {
        let request = self.request(discovery_request(node_id, names, metadata));
        let response = self.inner.fetch_secrets(request).await?.into_inner();
        decode_secrets(&response)
    }

    /// `StreamSecrets`: subscribes to `names` and yields every response, ACKing each (or
    /// NACKing one that does not decode), as Envoy does. The stream ends with the first
    /// error.
    pub async fn stream(
        &mut self,
        node_id: &str,
        names: &[String],
        metadata: Option<Struct>,
    ) -> Result<impl Stream<Item = Result<Vec<Secret>, ClientError>> + Send + 'static, ClientError>
    {
        let (tx, responses) = self.open_stream(node_id, names, metadata, 4).await?;
        let names = names.to_vec();
        let state = Some((responses, tx, names));
        Ok(futures::stream::unfold(state, |state| async move {
            let (mut responses, tx, names) = state?;
            match responses.message().await {
                Ok(Some(response)) => {
                    let decoded = decode_secrets(&response);
                    let reply = DiscoveryRequest {
                        version_info: response.version_info.clone(),
                        resource_names: names.clone(),
                        type_url: SECRET_TYPE_URL.to_owned(),
                        response_nonce: response.nonce.clone(),
                        error_detail: decoded.as_ref().err().map(|error| RpcStatus {
                            code: tonic::Code::InvalidArgument as i32,
                            message: error.to_string(),
                            details: Vec::new(),
                        }),
                        ..Default::default()
                    };
                    // If the server is gone, the next read reports it.
                    let _ = tx.send(reply).await;
                    Some((decoded, Some((responses, tx, names))))
                }
                Ok(None) => None,
                Err(status) => Some((Err(status.into()), None)),
            }
        }))
    }

    /// The underlying generated client, for protocol-level work (delta streams, custom
    /// nonces). Requests need the `authorization` metadata: see [`SdsClient::authorize`].
    pub fn raw(&self) -> SecretDiscoveryServiceClient<Channel> {
        self.inner.clone()
    }

    /// Adds this client's `authorization` metadata to a request.
    pub fn authorize<T>(&self, request: &mut tonic::Request<T>) {
        request
            .metadata_mut()
            .insert("authorization", self.authorization.clone());
    }
}

fn discovery_request(
    node_id: &str,
    names: &[String],
    metadata: Option<Struct>,
) -> DiscoveryRequest {
    DiscoveryRequest {
        node: Some(Node {
            id: node_id.to_owned(),
            metadata,
            ..Default::default()
        }),
        resource_names: names.to_vec(),
        type_url: SECRET_TYPE_URL.to_owned(),
        ..Default::default()
    }
}

/// Decodes the secrets of a response, checking their type.
pub fn decode_secrets(response: &DiscoveryResponse) -> Result<Vec<Secret>, ClientError> {
    let mut secrets = Vec::with_capacity(response.resources.len());
    for resource in &response.resources {
        if resource.type_url != SECRET_TYPE_URL {
            secrets.iter_mut().for_each(wipe_private_key);
            return Err(ClientError::InvalidResponse {
                reason: format!(
                    "resource of type {:?}, expected {SECRET_TYPE_URL:?}",
                    resource.type_url
                ),
            });
        }
        match Secret::decode(resource.value.as_slice()) {
            Ok(secret) => secrets.push(secret),
            Err(error) => {
                secrets.iter_mut().for_each(wipe_private_key);
                return Err(ClientError::InvalidResponse {
                    reason: format!("undecodable secret: {error}"),
                });
            }
        }
    }
    Ok(secrets)
}
