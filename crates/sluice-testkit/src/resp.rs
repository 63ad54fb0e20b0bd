//! A minimal RESP client for assertions: one inline command, the raw reply.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Sends `PING` and waits for `+PONG`.
pub fn ping(port: u16) -> bool {
    raw_command(port, "PING").starts_with("+PONG")
}

/// Sends one inline command and returns the raw reply (for assertions in tests).
pub fn raw_command(port: u16, command: &str) -> String {
    raw_command_as(port, None, command)
}

/// Like [`raw_command`], logging in with `password` first when there is one.
pub fn raw_command_as(port: u16, password: Option<&str>, command: &str) -> String {
    let address = ([127, 0, 0, 1], port).into();
    let Ok(mut stream) = TcpStream::connect_timeout(&address, Duration::from_secs(2)) else {
        return String::from("-ERR connection refused");
    };
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok();
    if let Some(password) = password {
        let mut ok = [0u8; 5];
        if stream
            .write_all(format!("AUTH {password}\r\n").as_bytes())
            .is_err()
            || stream.read_exact(&mut ok).is_err()
            || &ok != b"+OK\r\n"
        {
            return String::from("-ERR AUTH failed");
        }
    }
    if stream
        .write_all(format!("{command}\r\n").as_bytes())
        .is_err()
    {
        return String::from("-ERR write failed");
    }
    let mut buf = vec![0u8; 64 * 1024];
    let n = stream.read(&mut buf).unwrap_or(0);
    String::from_utf8_lossy(&buf[..n]).into_owned()
}
