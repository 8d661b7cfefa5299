//! Which requests a rule applies to. The request is seen through [`Request`],
//! so matching is tested without a host.

/// What a rule may look at in a request. Implementations fetch lazily.
pub trait Request {
    /// `:path` without the query string.
    fn path(&mut self) -> Option<String>;
    /// `:method`.
    fn method(&mut self) -> Option<String>;
    /// `:authority` (Host).
    fn authority(&mut self) -> Option<String>;
    /// A request header's raw value (`name` is lower case).
    fn header(&mut self, name: &str) -> Option<Vec<u8>>;
    /// The downstream remote address as the host reports it (`ip:port`).
    fn source_address(&mut self) -> Option<String>;
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

/// Conditions of a rule; all must hold. An empty match fits every request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Match {
    pub path_prefix: Option<String>,
    pub path_exact: Option<String>,
    /// Upper-case method names.
    pub methods: Vec<String>,
    /// Lower-case header names.
    pub headers: Vec<(String, HeaderMatch)>,
    /// Lower-case authority.
    pub authority: Option<String>,
}

/// The path part of a `:path` value (before `?` or `#`).
pub fn strip_query(path: &str) -> &str {
    path.find(['?', '#']).map_or(path, |i| &path[..i])
}

impl Match {
    /// Whether the match has no condition.
    pub fn is_empty(&self) -> bool {
        self.path_prefix.is_none()
            && self.path_exact.is_none()
            && self.methods.is_empty()
            && self.headers.is_empty()
            && self.authority.is_none()
    }

    /// Whether `req` fits every condition.
    pub fn matches(&self, req: &mut impl Request) -> bool {
        if self.path_prefix.is_some() || self.path_exact.is_some() {
            let Some(path) = req.path() else { return false };
            if self
                .path_prefix
                .as_ref()
                .is_some_and(|p| !path.starts_with(p.as_str()))
            {
                return false;
            }
            if self.path_exact.as_ref().is_some_and(|p| path != *p) {
                return false;
            }
        }
        if !self.methods.is_empty() {
            let Some(method) = req.method() else {
                return false;
            };
            if !self.methods.contains(&method) {
                return false;
            }
        }
        for (name, cond) in &self.headers {
            let value = req.header(name);
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
            if !req
                .authority()
                .is_some_and(|a| a.eq_ignore_ascii_case(want))
            {
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
    pub headers: Vec<(String, Vec<u8>)>,
    pub source: Option<String>,
    /// How many lookups were made (to test laziness).
    pub lookups: usize,
}

impl Request for FakeRequest {
    fn path(&mut self) -> Option<String> {
        self.lookups += 1;
        self.path.as_deref().map(|p| strip_query(p).to_string())
    }
    fn method(&mut self) -> Option<String> {
        self.lookups += 1;
        self.method.clone()
    }
    fn authority(&mut self) -> Option<String> {
        self.lookups += 1;
        self.authority.clone()
    }
    fn header(&mut self, name: &str) -> Option<Vec<u8>> {
        self.lookups += 1;
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    }
    fn source_address(&mut self) -> Option<String> {
        self.lookups += 1;
        self.source.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(path: &str, method: &str, host: &str, headers: &[(&str, &str)]) -> FakeRequest {
        FakeRequest {
            path: Some(path.into()),
            method: Some(method.into()),
            authority: Some(host.into()),
            headers: headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn empty_match_fits_all_and_looks_at_nothing() {
        let mut r = req("/x", "GET", "h", &[]);
        assert!(Match::default().matches(&mut r));
        assert_eq!(r.lookups, 0);
    }

    #[test]
    fn paths_ignore_the_query_string() {
        let m = Match {
            path_exact: Some("/api/items".into()),
            ..Default::default()
        };
        assert!(m.matches(&mut req("/api/items?page=2", "GET", "h", &[])));
        assert!(!m.matches(&mut req("/api/items/1", "GET", "h", &[])));
        let m = Match {
            path_prefix: Some("/api/".into()),
            ..Default::default()
        };
        assert!(m.matches(&mut req("/api/x", "GET", "h", &[])));
        assert!(!m.matches(&mut req("/ap?/api/", "GET", "h", &[])));
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
            authority: Some("shop.example.com".into()),
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
        assert_eq!(r.lookups, 1);
    }
}
