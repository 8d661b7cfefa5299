//! A minimal HTTP/1.1 client for `POST /json` on loopback: one kept-alive
//! connection per worker thread, Content-Length or chunked answers.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

pub struct Conn {
    addr: String,
    timeout: Duration,
    stream: Option<BufReader<TcpStream>>,
}

impl Conn {
    pub fn new(addr: &str, timeout: Duration) -> Conn {
        Conn {
            addr: addr.to_string(),
            timeout,
            stream: None,
        }
    }

    /// POSTs `body` to `/json`; returns (status, body). Reconnects once on a stale connection.
    pub fn post(&mut self, body: &[u8]) -> std::io::Result<(u16, Vec<u8>)> {
        match self.try_post(body) {
            Ok(r) => Ok(r),
            Err(_) if self.stream.is_none() => self.try_post(body),
            Err(e) => Err(e),
        }
    }

    fn try_post(&mut self, body: &[u8]) -> std::io::Result<(u16, Vec<u8>)> {
        if self.stream.is_none() {
            let s = TcpStream::connect(&self.addr)?;
            s.set_nodelay(true)?;
            s.set_read_timeout(Some(self.timeout))?;
            s.set_write_timeout(Some(self.timeout))?;
            self.stream = Some(BufReader::new(s));
        }
        let result = self.exchange(body);
        if result.is_err() {
            self.stream = None;
        }
        result
    }

    fn exchange(&mut self, body: &[u8]) -> std::io::Result<(u16, Vec<u8>)> {
        let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_string());
        let r = self.stream.as_mut().ok_or_else(|| bad("no connection"))?;
        let head = format!(
            "POST /json HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            self.addr,
            body.len()
        );
        let w = r.get_mut();
        w.write_all(head.as_bytes())?;
        w.write_all(body)?;
        let mut line = String::new();
        r.read_line(&mut line)?;
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad("status line"))?;
        let (mut length, mut chunked) = (None, false);
        loop {
            line.clear();
            r.read_line(&mut line)?;
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            let (k, v) = l.split_once(':').unwrap_or((l, ""));
            match k.trim().to_ascii_lowercase().as_str() {
                "content-length" => length = v.trim().parse::<usize>().ok(),
                "transfer-encoding" => chunked = v.to_ascii_lowercase().contains("chunked"),
                _ => {}
            }
        }
        let mut out = Vec::new();
        if chunked {
            loop {
                line.clear();
                r.read_line(&mut line)?;
                let n = usize::from_str_radix(line.trim(), 16).map_err(|_| bad("chunk size"))?;
                let mut chunk = vec![0; n + 2];
                r.read_exact(&mut chunk)?;
                if n == 0 {
                    break;
                }
                chunk.truncate(n);
                out.extend(chunk);
            }
        } else {
            let n = length.ok_or_else(|| bad("no length"))?;
            out.resize(n, 0);
            r.read_exact(&mut out)?;
        }
        Ok((status, out))
    }
}
