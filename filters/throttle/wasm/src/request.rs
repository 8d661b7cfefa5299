//! The request as rules see it: headers read lazily from the host, as bytes
//! (never assuming UTF-8), with `:path` cached (matching and keys may both
//! need it).

use throttle_core::matcher::{strip_query, Request};

use crate::host;

#[derive(Default)]
pub struct HostRequest {
    path: Option<Option<String>>,
}

fn lossy(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

impl Request for HostRequest {
    fn path(&mut self) -> Option<String> {
        self.path
            .get_or_insert_with(|| {
                host::request_header(":path").map(|p| strip_query(&lossy(p)).to_string())
            })
            .clone()
    }

    fn method(&mut self) -> Option<String> {
        host::request_header(":method").map(lossy)
    }

    fn authority(&mut self) -> Option<String> {
        host::request_header(":authority")
            .map(lossy)
            .filter(|a| !a.is_empty())
    }

    fn header(&mut self, name: &str) -> Option<Vec<u8>> {
        host::request_header(name)
    }

    fn source_address(&mut self) -> Option<String> {
        host::source_address()
    }
}
