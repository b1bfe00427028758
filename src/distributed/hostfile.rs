//! The hostfile of MLX's ring backend: which addresses each rank listens on.
//!
//! MLX's ring backend reads two environment variables when a group is initialised:
//! `MLX_RANK` (this process's rank, `0..n`) and `MLX_HOSTFILE` (the path of a JSON file). The
//! file is a list with one entry per rank, in rank order; each entry is a list of `"ip:port"`
//! strings, the addresses that rank listens on:
//!
//! ```json
//! [
//!   ["192.168.1.10:5000", "192.168.1.10:5001"],
//!   ["192.168.1.11:5000", "192.168.1.11:5001"]
//! ]
//! ```
//!
//! Rank `r` accepts connections from rank `r - 1` on its own addresses and connects to every
//! address of rank `r + 1` (the ring wraps around), so every rank must list the same number of
//! addresses; several addresses per rank give several TCP connections that MLX uses in
//! parallel. The addresses must be IPv4 addresses (MLX does not resolve host names), reachable
//! from the previous rank. `MLX_RING_VERBOSE=1` makes MLX log its connection attempts.
//!
//! [`Hostfile::read`] checks a file before MLX sees it: MLX itself aborts the process on an
//! empty list (a division by zero) and waits half a minute before failing on a one-rank list.

use super::DistributedError;
use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener};
use std::path::Path;

/// The addresses of every rank of a ring group, as MLX's `MLX_HOSTFILE` lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hostfile {
    /// For each rank, in rank order, the addresses it listens on.
    pub ranks: Vec<Vec<SocketAddrV4>>,
}

impl Hostfile {
    /// A hostfile for `n` ranks on this machine: `connections` loopback ports per rank, each
    /// found free by binding port 0 (the ports are released again before MLX binds them).
    pub fn local(n: usize, connections: usize) -> std::io::Result<Self> {
        let connections = connections.max(1);
        // Keep every listener open until all ports are chosen, so that no port repeats.
        let mut listeners = Vec::with_capacity(n * connections);
        let mut ranks = Vec::with_capacity(n);
        for _ in 0..n {
            let mut addresses = Vec::with_capacity(connections);
            for _ in 0..connections {
                let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
                let port = listener.local_addr()?.port();
                listeners.push(listener);
                addresses.push(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port));
            }
            ranks.push(addresses);
        }
        Ok(Hostfile { ranks })
    }

    /// A hostfile for one rank per IP address in `ips`, each listening on `connections`
    /// consecutive ports from `first_port` (the layout `mlx.launch` writes for several hosts).
    pub fn for_hosts(ips: &[Ipv4Addr], first_port: u16, connections: usize) -> Self {
        let connections = connections.max(1) as u16;
        let ranks = ips
            .iter()
            .map(|&ip| {
                (0..connections)
                    .map(|i| SocketAddrV4::new(ip, first_port.wrapping_add(i)))
                    .collect()
            })
            .collect();
        Hostfile { ranks }
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.ranks.len()
    }

    /// The JSON text MLX reads (`[["ip:port", ...], ...]`, one rank per line).
    pub fn to_json(&self) -> String {
        let mut out = String::from("[\n");
        for (r, addresses) in self.ranks.iter().enumerate() {
            out.push_str("  [");
            for (i, a) in addresses.iter().enumerate() {
                let sep = if i == 0 { "" } else { ", " };
                let _ = write!(out, "{sep}\"{a}\"");
            }
            out.push(']');
            out.push_str(if r + 1 == self.ranks.len() {
                "\n"
            } else {
                ",\n"
            });
        }
        out.push_str("]\n");
        out
    }

    /// Writes the JSON text to `path`.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        std::fs::write(path, self.to_json())
    }

    /// Reads and checks the hostfile at `path` (the value of `MLX_HOSTFILE`).
    pub fn read(path: &Path) -> Result<Self, DistributedError> {
        let config = |problem: String| {
            DistributedError::Config {
            backend: "ring".into(),
            problem,
            hint: "MLX_HOSTFILE must name a JSON file with one list of \"ip:port\" addresses \
                   per rank, for example [[\"127.0.0.1:5000\"], [\"127.0.0.1:5001\"]]; the \
                   launcher (burn_mlx::distributed::launch, or `cargo run -p burn-mlx-distributed --bin mlx_launch`) \
                   writes one"
                .into(),
        }
        };
        let text = std::fs::read_to_string(path).map_err(|e| {
            config(format!(
                "the hostfile {} (MLX_HOSTFILE) cannot be read: {e}",
                path.display()
            ))
        })?;
        Hostfile::parse(&text).map_err(|e| {
            config(format!(
                "the hostfile {} (MLX_HOSTFILE) {e}",
                path.display()
            ))
        })
    }

    /// Parses and checks hostfile text. The error completes the sentence "the hostfile ...".
    pub fn parse(text: &str) -> Result<Self, String> {
        let strings = Reader::new(text).read_hostfile()?;
        let mut ranks = Vec::with_capacity(strings.len());
        for (r, entry) in strings.iter().enumerate() {
            let mut addresses = Vec::with_capacity(entry.len());
            for s in entry {
                addresses.push(s.parse::<SocketAddrV4>().map_err(|_| {
                    format!(
                        "lists \"{s}\" for rank {r}: the ring backend needs an IPv4 address \
                         and a port, such as \"127.0.0.1:5000\" (it does not resolve host names)"
                    )
                })?);
            }
            ranks.push(addresses);
        }
        let hostfile = Hostfile { ranks };
        hostfile.check()?;
        Ok(hostfile)
    }

    /// The checks MLX does not make before it would crash or wait.
    fn check(&self) -> Result<(), String> {
        if self.ranks.len() < 2 {
            return Err(format!(
                "lists {} rank(s); a ring needs at least 2 (a single process needs no hostfile: \
                 leave MLX_HOSTFILE and MLX_RANK unset)",
                self.ranks.len()
            ));
        }
        let first = self.ranks[0].len();
        for (r, addresses) in self.ranks.iter().enumerate() {
            if addresses.is_empty() {
                return Err(format!("lists no address for rank {r}"));
            }
            if addresses.len() != first {
                return Err(format!(
                    "lists {} address(es) for rank {r} but {first} for rank 0; every rank needs \
                     the same number (one connection per address pair)",
                    addresses.len()
                ));
            }
        }
        let mut seen = std::collections::HashSet::new();
        for (r, addresses) in self.ranks.iter().enumerate() {
            for a in addresses {
                if !seen.insert(*a) {
                    return Err(format!("lists {a} twice (again for rank {r})"));
                }
            }
        }
        Ok(())
    }
}

/// A reader for exactly the JSON MLX accepts here (a list of lists of strings), with line and
/// column in its errors.
struct Reader<'a> {
    text: &'a str,
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(text: &'a str) -> Self {
        Reader { text, pos: 0 }
    }

    /// "is not valid: at line L, column C: expected ..., found ...".
    fn error(&self, expected: &str) -> String {
        let before = &self.text[..self.pos];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        let found = match self.text[self.pos..].chars().next() {
            None => "the end of the file".to_string(),
            Some(c) => format!("`{c}`"),
        };
        format!("is not a valid hostfile: at line {line}, column {column}: expected {expected}, found {found}")
    }

    fn skip_ws(&mut self) {
        let rest = &self.text[self.pos..];
        let trimmed = rest.trim_start_matches([' ', '\t', '\n', '\r']);
        self.pos += rest.len() - trimmed.len();
    }

    fn peek(&mut self) -> Option<char> {
        self.skip_ws();
        self.text[self.pos..].chars().next()
    }

    fn expect(&mut self, c: char, what: &str) -> Result<(), String> {
        if self.peek() == Some(c) {
            self.pos += 1;
            Ok(())
        } else {
            Err(self.error(what))
        }
    }

    /// `[` item (`,` item)* `]` or `[]`, calling `item` for each.
    fn list<T>(
        &mut self,
        what: &str,
        mut item: impl FnMut(&mut Self) -> Result<T, String>,
    ) -> Result<Vec<T>, String> {
        self.expect('[', &format!("`[` (the start of {what})"))?;
        let mut items = Vec::new();
        if self.peek() == Some(']') {
            self.pos += 1;
            return Ok(items);
        }
        loop {
            items.push(item(self)?);
            match self.peek() {
                Some(',') => self.pos += 1,
                Some(']') => {
                    self.pos += 1;
                    return Ok(items);
                }
                _ => return Err(self.error(&format!("`,` or `]` in {what}"))),
            }
        }
    }

    fn string(&mut self) -> Result<String, String> {
        self.expect('"', "a string \"ip:port\"")?;
        let start = self.pos;
        for (i, c) in self.text[start..].char_indices() {
            match c {
                '"' => {
                    self.pos = start + i + 1;
                    return Ok(self.text[start..start + i].to_string());
                }
                '\\' | '\n' => {
                    self.pos = start + i;
                    return Err(self.error("an address without escapes or line breaks"));
                }
                _ => {}
            }
        }
        self.pos = self.text.len();
        Err(self.error("the closing `\"` of a string"))
    }

    fn read_hostfile(&mut self) -> Result<Vec<Vec<String>>, String> {
        let ranks = self.list("the list of ranks", |r| {
            r.list("a rank's list of addresses", Self::string)
        })?;
        if self.peek().is_some() {
            return Err(self.error("nothing after the closing `]`"));
        }
        Ok(ranks)
    }
}
