//! The driver's part of a worker address: where it listens, and the
//! instance that names the worker.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

const ADDRESS_MAGIC: &[u8; 4] = b"RFT1";

/// The tcp driver's part of a worker address: where it listens, and the
/// random instance that names this worker (a connection that reaches
/// another worker on the same address is refused).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Address {
    /// The listening socket's address.
    pub socket: SocketAddr,
    /// This worker's instance.
    pub instance: u64,
}

impl Address {
    /// `"RFT1"`, family (4 or 6), port, instance, then 4 or 16 address
    /// bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(31);
        out.extend_from_slice(ADDRESS_MAGIC);
        match self.socket.ip() {
            IpAddr::V4(ip) => {
                out.push(4);
                out.extend_from_slice(&self.socket.port().to_le_bytes());
                out.extend_from_slice(&self.instance.to_le_bytes());
                out.extend_from_slice(&ip.octets());
            }
            IpAddr::V6(ip) => {
                out.push(6);
                out.extend_from_slice(&self.socket.port().to_le_bytes());
                out.extend_from_slice(&self.instance.to_le_bytes());
                out.extend_from_slice(&ip.octets());
            }
        }
        out
    }

    /// Decodes a peer's address part; `None` if malformed (wrong magic,
    /// family or length, port 0, an unspecified address).
    pub fn decode(b: &[u8]) -> Option<Address> {
        let rest = b.strip_prefix(ADDRESS_MAGIC)?;
        let (&family, rest) = rest.split_first()?;
        let port = u16::from_le_bytes(rest.get(0..2)?.try_into().ok()?);
        let instance = u64::from_le_bytes(rest.get(2..10)?.try_into().ok()?);
        let ip = rest.get(10..)?;
        let ip = match family {
            4 => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(ip).ok()?)),
            6 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(ip).ok()?)),
            _ => return None,
        };
        if port == 0 || ip.is_unspecified() {
            return None;
        }
        Some(Address {
            socket: SocketAddr::new(ip, port),
            instance,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn addresses_round_trip_and_refuse_garbage() {
        for socket in ["127.0.0.1:4000", "[::1]:4000", "[fd00::2]:65535"] {
            let a = Address {
                socket: socket.parse().unwrap(),
                instance: 0x1234_5678_9abc_def0,
            };
            assert_eq!(Address::decode(&a.encode()), Some(a));
        }
        let good = Address {
            socket: "10.0.0.1:1".parse().unwrap(),
            instance: 1,
        }
        .encode();
        assert_eq!(Address::decode(&good[..good.len() - 1]), None);
        let mut longer = good.clone();
        longer.push(0);
        assert_eq!(Address::decode(&longer), None);
        let mut family = good.clone();
        family[4] = 5;
        assert_eq!(Address::decode(&family), None);
        let mut magic = good.clone();
        magic[0] = b'X';
        assert_eq!(Address::decode(&magic), None);
        for socket in ["0.0.0.0:1", "10.0.0.1:0", "[::]:5"] {
            let a = Address {
                socket: socket.parse().unwrap(),
                instance: 1,
            };
            assert_eq!(Address::decode(&a.encode()), None, "{socket}");
        }
    }
}
