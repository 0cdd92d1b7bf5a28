use std::net::{Ipv4Addr, TcpListener};

use crate::Result;

/// A port that was free on 127.0.0.1 a moment ago. Another process may take it before ours
/// binds; callers detect that ("address already in use") and retry with a new port.
pub(crate) fn free_port() -> Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(listener.local_addr()?.port())
}
