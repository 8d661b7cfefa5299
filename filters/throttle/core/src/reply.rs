//! The local replies the filter sends: rejections.

/// gRPC's RESOURCE_EXHAUSTED: what Envoy's own local rate limit answers with
/// `rate_limited_as_resource_exhausted`. gRPC clients and Istio's default
/// retry policy (`retryOn: ...,unavailable,...`) do not retry it at once,
/// whereas UNAVAILABLE (14, Envoy's mapping of HTTP 429) is retried at once,
/// ignoring `retry-after`.
pub const GRPC_RESOURCE_EXHAUSTED: u32 = 8;

/// Response details of our rejections (Envoy's `%RESPONSE_CODE_DETAILS%`).
pub const DETAILS: &str = "throttle_rejected";

/// A local reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// HTTP status (for gRPC requests Envoy sends 200 with `grpc-status`).
    pub status: u16,
    /// The gRPC status, for gRPC requests.
    pub grpc_status: Option<u32>,
    pub headers: Vec<(&'static str, String)>,
    /// The body; for gRPC, the `grpc-message`.
    pub body: &'static str,
    pub details: &'static str,
}

/// A rejection: `status` (gRPC: RESOURCE_EXHAUSTED), `retry-after` in whole
/// seconds (at least 1), and the rate-limit headers if any.
pub fn rejection(
    status: u16,
    retry_after_s: u64,
    grpc: bool,
    rate_headers: Vec<(&'static str, String)>,
) -> Reply {
    let mut headers = vec![("retry-after", retry_after_s.max(1).to_string())];
    if !grpc {
        headers.push(("content-type", "text/plain".to_string()));
    }
    headers.extend(rate_headers);
    Reply {
        status,
        grpc_status: grpc.then_some(GRPC_RESOURCE_EXHAUSTED),
        headers,
        // gRPC carries the body in `grpc-message`: no trailing newline there.
        body: if grpc {
            "throttled: retry later"
        } else {
            "throttled: retry later\n"
        },
        details: DETAILS,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_and_grpc_rejections() {
        let r = rejection(429, 0, false, vec![]);
        assert_eq!(r.status, 429);
        assert_eq!(r.grpc_status, None);
        assert_eq!(
            r.headers,
            vec![
                ("retry-after", "1".to_string()),
                ("content-type", "text/plain".to_string())
            ]
        );
        assert_eq!(r.body, "throttled: retry later\n");
        let g = rejection(429, 3, true, vec![("ratelimit", "x".into())]);
        assert_eq!(g.grpc_status, Some(8));
        assert_eq!(g.body, "throttled: retry later");
        assert_eq!(
            g.headers,
            vec![
                ("retry-after", "3".to_string()),
                ("ratelimit", "x".to_string())
            ]
        );
    }
}
