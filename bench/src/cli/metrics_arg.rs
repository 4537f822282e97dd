//! `--metrics-addr` of `weir run`, `weir nexmark` and `weir bench`: where
//! the job serves its metrics endpoint (see `docs/guide/observability.md`).

use std::net::{Ipv4Addr, SocketAddr};

/// Parses `PORT` (loopback) or `IP:PORT`.
pub fn parse(s: &str) -> Result<SocketAddr, String> {
    if let Ok(port) = s.parse::<u16>() {
        return Ok(SocketAddr::from((Ipv4Addr::LOCALHOST, port)));
    }
    s.parse::<SocketAddr>()
        .map_err(|e| format!("'{s}' is neither a port nor IP:PORT ({e}); e.g. 9464 or 127.0.0.1:9464"))
}

/// Tells the user where the endpoint is.
pub fn announce(job: &weir_core::JobHandle) {
    if let Some(a) = job.metrics_addr() {
        eprintln!("metrics: http://{a}/ (Prometheus: http://{a}/metrics)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_alone_is_loopback() {
        assert_eq!(parse("9464").unwrap().to_string(), "127.0.0.1:9464");
        assert_eq!(parse("0.0.0.0:80").unwrap().to_string(), "0.0.0.0:80");
        assert!(parse("localhost").unwrap_err().contains("neither a port"));
    }
}
