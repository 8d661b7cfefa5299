//! Which requests a rule applies to. The host's view of a request comes
//! through [`Request`] (raw bytes, fetched lazily); [`Facts`] adds what rules
//! see of it (the normalised path and host, see [`crate::path`]), so matching
//! is tested without a host.

use crate::path::{normalize_authority, normalize_path};

/// The raw request, as the host has it. Implementations fetch lazily.
pub trait Request {
    /// The raw `:path` value.
    fn path(&mut self) -> Option<Vec<u8>>;
    /// `:method`.
    fn method(&mut self) -> Option<Vec<u8>>;
    /// The raw `:authority` (Host).
    fn authority(&mut self) -> Option<Vec<u8>>;
    /// A request header's value (`name` is lower case); a header sent on
    /// several lines gives its values joined with `,`.
    fn header(&mut self, name: &str) -> Option<Vec<u8>>;
    /// The downstream remote address as Envoy trusts it (`ip:port`).
    fn source_address(&mut self) -> Option<String>;
    /// The peer's mTLS identity (first URI SAN of its certificate).
    fn principal(&mut self) -> Option<String>;
}

/// A request as rules see it: the raw request plus its normalised path,
/// computed at most once.
pub struct Facts<R> {
    raw: R,
    path: Option<Option<String>>,
}

impl<R: Request> Facts<R> {
    pub fn new(raw: R) -> Self {
        Facts { raw, path: None }
    }

    /// The raw request.
    pub fn raw(&mut self) -> &mut R {
        &mut self.raw
    }

    /// The normalised path ([`normalize_path`]).
    pub fn path(&mut self) -> Option<&str> {
        let raw = &mut self.raw;
        self.path
            .get_or_insert_with(|| raw.path().map(|p| normalize_path(&p)))
            .as_deref()
    }

    /// The request's host (normalised) and port.
    pub fn authority(&mut self) -> Option<(String, Option<String>)> {
        let a = self.raw.authority()?;
        let a = String::from_utf8_lossy(&a);
        let (host, port) = normalize_authority(&a);
        (!host.is_empty()).then(|| (host, port.map(str::to_string)))
    }

    /// Whether the request is gRPC (`content-type: application/grpc...`).
    pub fn is_grpc(&mut self) -> bool {
        self.raw
            .header("content-type")
            .is_some_and(|v| v.starts_with(b"application/grpc"))
    }
}

/// A condition on one header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderMatch {
    /// The header has exactly this value.
    Exact(String),
    /// The header is present.
    Present,
    /// The header is absent.
    Absent,
}

/// A condition on the host: the host (normalised), and the port if one was
/// configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthorityMatch {
    pub host: String,
    pub port: Option<String>,
}

/// Conditions of a rule; all must hold. An empty match fits every request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Match {
    /// Normalised.
    pub path_prefix: Option<String>,
    /// Normalised.
    pub path_exact: Option<String>,
    /// Upper-case method names.
    pub methods: Vec<String>,
    /// Lower-case header names.
    pub headers: Vec<(String, HeaderMatch)>,
    pub authority: Option<AuthorityMatch>,
    /// The caller's mTLS identity, exactly.
    pub principal: Option<String>,
}

impl Match {
    /// Whether the match has no condition.
    pub fn is_empty(&self) -> bool {
        self.path_prefix.is_none()
            && self.path_exact.is_none()
            && self.methods.is_empty()
            && self.headers.is_empty()
            && self.authority.is_none()
            && self.principal.is_none()
    }

    /// Whether `req` fits every condition.
    pub fn matches<R: Request>(&self, req: &mut Facts<R>) -> bool {
        if self.path_prefix.is_some() || self.path_exact.is_some() {
            let Some(path) = req.path() else { return false };
            if self
                .path_prefix
                .as_ref()
                .is_some_and(|p| !path.starts_with(p.as_str()))
            {
                return false;
            }
            if self.path_exact.as_ref().is_some_and(|p| path != p) {
                return false;
            }
        }
        if !self.methods.is_empty() {
            let Some(method) = req.raw().method() else {
                return false;
            };
            if !self.methods.iter().any(|m| m.as_bytes() == method) {
                return false;
            }
        }
        for (name, cond) in &self.headers {
            let value = req.raw().header(name);
            let ok = match cond {
                HeaderMatch::Exact(want) => value.as_deref() == Some(want.as_bytes()),
                HeaderMatch::Present => value.is_some(),
                HeaderMatch::Absent => value.is_none(),
            };
            if !ok {
                return false;
            }
        }
        if let Some(want) = &self.authority {
            let Some((host, port)) = req.authority() else {
                return false;
            };
            if host != want.host || (want.port.is_some() && port != want.port) {
                return false;
            }
        }
        if let Some(want) = &self.principal {
            if req.raw().principal().as_deref() != Some(want.as_str()) {
                return false;
            }
        }
        true
    }
}

/// A request made of plain values, for tests (and tools).
#[derive(Debug, Default, Clone)]
pub struct FakeRequest {
    pub path: Option<String>,
    pub method: Option<String>,
    pub authority: Option<String>,
    /// Header lines; a name may repeat.
    pub headers: Vec<(String, Vec<u8>)>,
    pub source: Option<String>,
    pub principal: Option<String>,
    /// How many lookups were made (to test laziness).
    pub lookups: usize,
}

impl FakeRequest {
    /// A GET of `path`.
    pub fn get(path: &str) -> Self {
        FakeRequest {
            path: Some(path.into()),
            method: Some("GET".into()),
            authority: Some("example.com".into()),
            ..Default::default()
        }
    }

    /// With this header line added.
    pub fn with_header(mut self, name: &str, value: &str) -> Self {
        self.headers
            .push((name.to_ascii_lowercase(), value.as_bytes().to_vec()));
        self
    }
}

impl Request for FakeRequest {
    fn path(&mut self) -> Option<Vec<u8>> {
        self.lookups += 1;
        self.path.as_ref().map(|p| p.as_bytes().to_vec())
    }
    fn method(&mut self) -> Option<Vec<u8>> {
        self.lookups += 1;
        self.method.as_ref().map(|m| m.as_bytes().to_vec())
    }
    fn authority(&mut self) -> Option<Vec<u8>> {
        self.lookups += 1;
        self.authority.as_ref().map(|a| a.as_bytes().to_vec())
    }
    fn header(&mut self, name: &str) -> Option<Vec<u8>> {
        self.lookups += 1;
        let values: Vec<&[u8]> = self
            .headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
            .collect();
        (!values.is_empty()).then(|| values.join(&b","[..]))
    }
    fn source_address(&mut self) -> Option<String> {
        self.lookups += 1;
        self.source.clone()
    }
    fn principal(&mut self) -> Option<String> {
        self.lookups += 1;
        self.principal.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(path: &str, method: &str, host: &str, headers: &[(&str, &str)]) -> Facts<FakeRequest> {
        Facts::new(FakeRequest {
            path: Some(path.into()),
            method: Some(method.into()),
            authority: Some(host.into()),
            headers: headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
                .collect(),
            ..Default::default()
        })
    }

    fn prefix(p: &str) -> Match {
        Match {
            path_prefix: Some(normalize_path(p.as_bytes())),
            ..Default::default()
        }
    }

    #[test]
    fn empty_match_fits_all_and_looks_at_nothing() {
        let mut r = req("/x", "GET", "h", &[]);
        assert!(Match::default().matches(&mut r));
        assert_eq!(r.raw().lookups, 0);
    }

    #[test]
    fn paths_ignore_the_query_string() {
        let m = Match {
            path_exact: Some("/api/items".into()),
            ..Default::default()
        };
        assert!(m.matches(&mut req("/api/items?page=2", "GET", "h", &[])));
        assert!(!m.matches(&mut req("/api/items/1", "GET", "h", &[])));
        let m = prefix("/api/");
        assert!(m.matches(&mut req("/api/x?y", "GET", "h", &[])));
        assert!(!m.matches(&mut req("/ap?/api/", "GET", "h", &[])));
    }

    #[test]
    fn a_path_rule_cannot_be_escaped_by_spelling() {
        let m = prefix("/admin");
        for p in [
            "/admin",
            "/%61dmin",
            "//admin",
            "/./admin/x",
            "/x/../admin",
            "/%2e%2e/admin",
            "/%2Fadmin",
            "/\\admin",
        ] {
            assert!(m.matches(&mut req(p, "GET", "h", &[])), "{p} escaped");
        }
        assert!(!m.matches(&mut req("/web/admin", "GET", "h", &[])));
        let exact = Match {
            path_exact: Some(normalize_path(b"/login")),
            ..Default::default()
        };
        assert!(exact.matches(&mut req("//log%69n?next=/", "POST", "h", &[])));
    }

    #[test]
    fn the_host_matches_without_port_case_or_trailing_dot() {
        let any_port = Match {
            authority: Some(AuthorityMatch {
                host: "example.com".into(),
                port: None,
            }),
            ..Default::default()
        };
        for h in [
            "example.com",
            "Example.COM",
            "example.com:8080",
            "example.com.",
        ] {
            assert!(any_port.matches(&mut req("/", "GET", h, &[])), "{h}");
        }
        assert!(!any_port.matches(&mut req("/", "GET", "example.org", &[])));
        let port = Match {
            authority: Some(AuthorityMatch {
                host: "example.com".into(),
                port: Some("8080".into()),
            }),
            ..Default::default()
        };
        assert!(port.matches(&mut req("/", "GET", "EXAMPLE.com.:8080", &[])));
        assert!(!port.matches(&mut req("/", "GET", "example.com", &[])));
        assert!(!port.matches(&mut req("/", "GET", "example.com:9090", &[])));
    }

    #[test]
    fn a_header_on_several_lines_matches_on_its_joined_value() {
        let m = Match {
            headers: vec![("x-env".into(), HeaderMatch::Exact("a,b".into()))],
            ..Default::default()
        };
        assert!(m.matches(&mut req("/", "GET", "h", &[("x-env", "a"), ("x-env", "b")])));
        assert!(!m.matches(&mut req("/", "GET", "h", &[("x-env", "a")])));
    }

    #[test]
    fn all_conditions_must_hold() {
        let m = Match {
            path_prefix: Some("/api".into()),
            methods: vec!["POST".into(), "PUT".into()],
            headers: vec![
                ("x-tenant".into(), HeaderMatch::Exact("gold".into())),
                ("x-debug".into(), HeaderMatch::Absent),
                ("authorization".into(), HeaderMatch::Present),
            ],
            authority: Some(AuthorityMatch {
                host: "shop.example.com".into(),
                port: None,
            }),
            ..Default::default()
        };
        let good = [("x-tenant", "gold"), ("authorization", "Bearer t")];
        assert!(m.matches(&mut req("/api/a", "POST", "Shop.Example.COM", &good)));
        assert!(!m.matches(&mut req("/web", "POST", "shop.example.com", &good)));
        assert!(!m.matches(&mut req("/api/a", "GET", "shop.example.com", &good)));
        assert!(!m.matches(&mut req("/api/a", "POST", "other.example.com", &good)));
        assert!(!m.matches(&mut req(
            "/api/a",
            "POST",
            "shop.example.com",
            &[("x-tenant", "silver"), ("authorization", "t")]
        )));
        assert!(!m.matches(&mut req(
            "/api/a",
            "POST",
            "shop.example.com",
            &[("x-tenant", "gold")]
        )));
        let debug = [
            ("x-tenant", "gold"),
            ("authorization", "t"),
            ("x-debug", "1"),
        ];
        assert!(!m.matches(&mut req("/api/a", "POST", "shop.example.com", &debug)));
    }

    #[test]
    fn a_failed_condition_stops_further_lookups() {
        let m = Match {
            path_prefix: Some("/api".into()),
            headers: vec![("x-a".into(), HeaderMatch::Present)],
            ..Default::default()
        };
        let mut r = req("/web", "GET", "h", &[]);
        assert!(!m.matches(&mut r));
        assert_eq!(r.raw().lookups, 1);
    }

    #[test]
    fn the_principal_matches_exactly() {
        let m = Match {
            principal: Some("spiffe://cluster.local/ns/shop/sa/checkout".into()),
            ..Default::default()
        };
        let with = |p: Option<&str>| {
            let mut r = req("/", "GET", "h", &[]);
            r.raw().principal = p.map(str::to_string);
            m.matches(&mut r)
        };
        assert!(with(Some("spiffe://cluster.local/ns/shop/sa/checkout")));
        assert!(!with(Some("spiffe://cluster.local/ns/shop/sa/checkout2")));
        assert!(!with(Some("spiffe://cluster.local/ns/shop/sa")));
        assert!(!with(None), "no identity (plain text) never matches");
        assert!(!m.is_empty());
    }

    #[test]
    fn grpc_is_told_by_content_type() {
        assert!(req(
            "/",
            "POST",
            "h",
            &[("content-type", "application/grpc+proto")]
        )
        .is_grpc());
        assert!(!req("/", "POST", "h", &[("content-type", "application/json")]).is_grpc());
        assert!(!req("/", "POST", "h", &[]).is_grpc());
    }
}
