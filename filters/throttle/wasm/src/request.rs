//! The request as the core's [`Request`] sees it: read lazily from the host,
//! as bytes (never assuming UTF-8).

use throttle_core::matcher::Request;

use crate::host::Host;

/// The effective stream's request.
pub struct HostRequest<H> {
    host: H,
}

impl<H: Host> HostRequest<H> {
    pub fn new(host: H) -> Self {
        HostRequest { host }
    }
}

fn text(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

impl<H: Host> Request for HostRequest<H> {
    fn path(&mut self) -> Option<Vec<u8>> {
        self.host.request_header(":path")
    }

    fn method(&mut self) -> Option<Vec<u8>> {
        self.host.request_header(":method")
    }

    fn authority(&mut self) -> Option<Vec<u8>> {
        self.host.request_header(":authority")
    }

    fn header(&mut self, name: &str) -> Option<Vec<u8>> {
        // Envoy's `request.headers` attribute joins a header's lines with
        // ','; the plain header call would give the first line only.
        self.host.property(&["request", "headers", name])
    }

    fn source_address(&mut self) -> Option<String> {
        self.host.property(&["source", "address"]).map(text)
    }

    fn principal(&mut self) -> Option<String> {
        self.host
            .property(&["connection", "uri_san_peer_certificate"])
            .or_else(|| {
                self.host
                    .property(&["filter_state", "io.istio.peer_principal"])
            })
            .map(text)
            .filter(|p| !p.is_empty())
    }
}
