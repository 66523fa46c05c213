//! A MeshIdentity's `spiffeID` templates, rendered into a SPIFFE ID for one dataplane.

use crate::template::{Template, TemplateError, TemplateVars};
use crate::{SpiffeId, SpiffeIdError, TrustDomain};

/// The trust-domain template used when a MeshIdentity gives none.
pub const DEFAULT_TRUST_DOMAIN: &str = "{{ .Mesh }}.{{ .Zone }}.mesh.local";
/// The path template used when a MeshIdentity gives none.
pub const DEFAULT_PATH: &str = "/workload/{{ .Workload }}";

/// Why an identity template does not parse, or does not render into a valid SPIFFE ID.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IdentityError {
    /// The `spiffeID.trustDomain` template does not parse or render.
    #[error("spiffeID.trustDomain: {0}")]
    TrustDomainTemplate(#[source] TemplateError),
    /// The `spiffeID.path` template does not parse or render.
    #[error("spiffeID.path: {0}")]
    PathTemplate(#[source] TemplateError),
    /// The trust-domain template reads dataplane labels, which would split a mesh into trust domains.
    #[error("spiffeID.trustDomain may only use {{{{ .Mesh }}}} and {{{{ .Zone }}}}, not dataplane labels")]
    TrustDomainUsesLabels,
    /// The rendered trust domain is not a valid SPIFFE trust domain.
    #[error("spiffeID.trustDomain rendered to {rendered:?}, which is not a valid trust domain: {source}")]
    InvalidTrustDomain {
        /// What the template produced.
        rendered: String,
        /// The rule it breaks.
        source: SpiffeIdError,
    },
    /// The rendered ID is not a valid SPIFFE ID.
    #[error("spiffeID rendered to {rendered:?}, which is not a valid SPIFFE ID: {source}")]
    InvalidId {
        /// The ID the templates produced (trust domain and path).
        rendered: String,
        /// The rule it breaks.
        source: SpiffeIdError,
    },
    /// The path rendered empty: the trust domain's root ID cannot identify a workload.
    #[error("spiffeID rendered to {rendered:?}, a trust domain root ID, which no workload may hold; the path must not be empty")]
    RootId {
        /// The root ID the templates produced.
        rendered: String,
    },
}

/// A MeshIdentity's trust-domain and path templates, parsed once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdentityTemplate {
    trust_domain: Template,
    path: Template,
}

impl IdentityTemplate {
    /// Parses the templates; `None` selects [`DEFAULT_TRUST_DOMAIN`] / [`DEFAULT_PATH`].
    pub fn parse(trust_domain: Option<&str>, path: Option<&str>) -> Result<Self, IdentityError> {
        let trust_domain = Template::parse(trust_domain.unwrap_or(DEFAULT_TRUST_DOMAIN))
            .map_err(IdentityError::TrustDomainTemplate)?;
        if trust_domain.uses_labels() {
            return Err(IdentityError::TrustDomainUsesLabels);
        }
        let path =
            Template::parse(path.unwrap_or(DEFAULT_PATH)).map_err(IdentityError::PathTemplate)?;
        Ok(IdentityTemplate { trust_domain, path })
    }

    /// The trust-domain template.
    pub fn trust_domain(&self) -> &Template {
        &self.trust_domain
    }

    /// The path template.
    pub fn path(&self) -> &Template {
        &self.path
    }

    /// Renders only the trust domain (it never depends on labels).
    pub fn render_trust_domain(
        &self,
        vars: &TemplateVars<'_>,
    ) -> Result<TrustDomain, IdentityError> {
        let rendered = self
            .trust_domain
            .render(vars)
            .map_err(IdentityError::TrustDomainTemplate)?;
        TrustDomain::parse(&rendered)
            .map_err(|source| IdentityError::InvalidTrustDomain { rendered, source })
    }

    /// Renders the SPIFFE ID of one dataplane. Nothing is lowercased or otherwise repaired: an invalid
    /// result is an error quoting what was rendered and the rule it breaks.
    pub fn render(&self, vars: &TemplateVars<'_>) -> Result<SpiffeId, IdentityError> {
        let trust_domain = self.render_trust_domain(vars)?;
        self.render_in(&trust_domain, vars)
    }

    /// Renders the SPIFFE ID of one dataplane in `trust_domain`, already rendered (a MeshIdentity's
    /// trust domain is rendered once, with the zone it comes from).
    pub fn render_in(
        &self,
        trust_domain: &TrustDomain,
        vars: &TemplateVars<'_>,
    ) -> Result<SpiffeId, IdentityError> {
        let path = self
            .path
            .render(vars)
            .map_err(IdentityError::PathTemplate)?;
        let id = SpiffeId::new(trust_domain, &path).map_err(|source| IdentityError::InvalidId {
            rendered: format!("{}{path}", trust_domain.id()),
            source,
        })?;
        if id.is_root() {
            return Err(IdentityError::RootId {
                rendered: id.to_string(),
            });
        }
        Ok(id)
    }
}
