//! A gRPC service as tonic's router mounts it, from a type that answers every request of the service:
//! the one `tower::Service` SDS, the Workload API (and its SDS methods) and the agent protocol share, so
//! that each states only its name and how it answers.

use std::convert::Infallible;
use std::task::{Context, Poll};

use tonic::codegen::{http, Body, BoxFuture, Service, StdError};
use tonic::server::NamedService;

/// What a gRPC service answers: every method of the service named [`GrpcMethods::NAME`], routed by path
/// inside [`GrpcMethods::answer`] (a path it does not know gets `UNIMPLEMENTED`).
pub trait GrpcMethods: Clone + Send + Sync + 'static {
    /// The service's name, as gRPC routes by it (`package.Service`).
    const NAME: &'static str;

    /// The response to one request of the service; errors are gRPC statuses in the response.
    fn answer(
        &self,
        request: http::Request<tonic::body::Body>,
    ) -> BoxFuture<http::Response<tonic::body::Body>, Infallible>;
}

/// `M` as a service tonic's [`tonic::service::Routes`] mounts.
#[derive(Clone, Debug)]
pub struct Grpc<M>(pub M);

impl<M: GrpcMethods> NamedService for Grpc<M> {
    const NAME: &'static str = M::NAME;
}

impl<M, B> Service<http::Request<B>> for Grpc<M>
where
    M: GrpcMethods,
    B: Body<Data = tonic::codegen::Bytes> + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        self.0.answer(request.map(tonic::body::Body::new))
    }
}
