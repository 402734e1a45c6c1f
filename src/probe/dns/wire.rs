//! One DNS question and its answer on the wire: the query written and the answer
//! read by `hickory-proto`, over UDP, and again over TCP when the answer comes
//! back truncated. Every read is bounded: a UDP answer by [`MAX_UDP`] bytes, a
//! TCP one by [`MAX_TCP`], the records kept by [`MAX_RECORDS`] and
//! [`MAX_RECORD_LEN`]; past a bound the answer is refused with a sentence, never
//! read further.

use std::net::SocketAddr;
use std::time::Duration;

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query};
use hickory_proto::rr::{Name, RData, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};

/// The most bytes of a UDP answer read; a longer datagram is taken as
/// truncated and the question asked again over TCP. The query advertises
/// [`EDNS_PAYLOAD`], the size DNS Flag Day 2020 settled on, so a resolver that
/// keeps to it never comes near.
pub const MAX_UDP: usize = 4096;
/// The UDP payload size the query advertises (EDNS).
const EDNS_PAYLOAD: u16 = 1232;
/// The most bytes of a TCP answer read (its length prefix is two bytes, so no
/// answer is longer; the bound is stated rather than implied).
pub const MAX_TCP: usize = 65_535;
/// The most records of the asked type an answer may hold.
pub const MAX_RECORDS: usize = 64;
/// The most bytes one record may take as text (a TXT record's strings joined).
pub const MAX_RECORD_LEN: usize = 1024;
/// A UDP query not answered within this long is sent again (a lost datagram
/// costs this much rather than the whole probe timeout).
const RESEND: Duration = Duration::from_secs(1);

/// What a resolver answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// The response code's mnemonic: `NOERROR`, `NXDOMAIN`, `SERVFAIL`, …
    pub rcode: String,
    /// The records of the asked type, as text (an address, a name without its
    /// trailing dot, `PREFERENCE EXCHANGE`, `PRIORITY WEIGHT PORT TARGET`, a TXT
    /// record's strings joined), sorted, without duplicates.
    pub records: Vec<String>,
    /// The least TTL of those records, in seconds.
    pub ttl: Option<u32>,
    /// The answer came over TCP (the UDP one was truncated).
    pub tcp: bool,
}

/// Why a question got no answer waitd reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// Worth asking again: no answer, a broken one, a lost connection.
    Transient(String),
    /// The answer is over one of the bounds: asking again fetches it again.
    Bounded(String),
}

impl Failure {
    pub fn sentence(&self) -> &str {
        match self {
            Failure::Transient(s) | Failure::Bounded(s) => s,
        }
    }
}

/// The query for `name`'s records of `record_type`, with recursion desired and
/// an EDNS payload size.
pub fn query(id: u16, name: &str, record_type: &str) -> Result<Vec<u8>, String> {
    let name = Name::from_ascii(format!("{name}."))
        .map_err(|e| format!("the name cannot be asked about ({e})"))?;
    let rtype: RecordType = record_type
        .parse()
        .map_err(|_| format!("the record type {record_type} cannot be asked for"))?;
    let mut m = Message::new(id, MessageType::Query, OpCode::Query);
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(name, rtype));
    let mut edns = Edns::new();
    edns.set_max_payload(EDNS_PAYLOAD);
    m.edns = Some(edns);
    m.to_vec()
        .map_err(|e| format!("the query could not be written ({e})"))
}

/// Asks `resolver` one question over UDP, and over TCP when the answer is
/// truncated. The caller bounds the time.
pub async fn exchange(
    resolver: SocketAddr,
    name: &str,
    record_type: &str,
) -> Result<Answer, Failure> {
    let id = fastrand::u16(..);
    let query = query(id, name, record_type).map_err(Failure::Bounded)?;
    let at = resolver;
    let io = |e: std::io::Error| {
        Failure::Transient(format!("the resolver {at} could not be asked: {e}"))
    };
    let local: SocketAddr = if resolver.is_ipv4() {
        ([0, 0, 0, 0], 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let socket = UdpSocket::bind(local).await.map_err(io)?;
    socket.connect(resolver).await.map_err(io)?;
    let mut buf = vec![0u8; MAX_UDP + 1];
    let mut resend = tokio::time::interval(RESEND);
    loop {
        tokio::select! {
            _ = resend.tick() => {
                socket.send(&query).await.map_err(io)?;
            }
            got = socket.recv(&mut buf) => {
                let n = got.map_err(io)?;
                if n > MAX_UDP {
                    break;
                }
                // Another answer than ours (a late one to an earlier question of
                // this port, or a stranger's): not read.
                if n < 2 || u16::from_be_bytes([buf[0], buf[1]]) != id {
                    continue;
                }
                match read_answer(&buf[..n], id, name, record_type) {
                    Err(Truncated) => break,
                    Ok(answer) => return answer,
                }
            }
        }
    }
    drop(socket);
    let mut stream = TcpStream::connect(resolver).await.map_err(io)?;
    let mut framed = (query.len() as u16).to_be_bytes().to_vec();
    framed.extend_from_slice(&query);
    stream.write_all(&framed).await.map_err(io)?;
    let mut len = [0u8; 2];
    stream.read_exact(&mut len).await.map_err(io)?;
    let len = usize::from(u16::from_be_bytes(len));
    if len > MAX_TCP {
        return Err(Failure::Bounded(format!(
            "the resolver {at} sent an answer of {len} bytes over TCP, more than the {MAX_TCP} waitd reads"
        )));
    }
    let mut body = vec![0u8; len];
    stream.read_exact(&mut body).await.map_err(io)?;
    match read_answer(&body, id, name, record_type) {
        Ok(Ok(mut answer)) => {
            answer.tcp = true;
            Ok(answer)
        }
        Ok(Err(failure)) => Err(failure),
        Err(Truncated) => Err(Failure::Transient(format!(
            "the resolver {at} answered truncated over TCP too"
        ))),
    }
}

/// The answer was truncated: ask again over TCP.
#[derive(Debug, PartialEq, Eq)]
pub struct Truncated;

/// Reads an answer to the question `id` about `name`'s records of
/// `record_type`: the answer, a failure, or [`Truncated`].
pub fn read_answer(
    bytes: &[u8],
    id: u16,
    name: &str,
    record_type: &str,
) -> Result<Result<Answer, Failure>, Truncated> {
    let message = match Message::from_vec(bytes) {
        Ok(m) => m,
        Err(e) => {
            return Ok(Err(Failure::Transient(format!(
                "the resolver's answer is not a DNS message ({e})"
            ))));
        }
    };
    let meta = &message.metadata;
    if meta.id != id || meta.message_type != MessageType::Response {
        return Ok(Err(Failure::Transient(
            "the resolver's answer is not an answer to the question asked".into(),
        )));
    }
    if meta.truncation {
        return Err(Truncated);
    }
    if let Some(q) = message.queries.first() {
        let asked = q.name().to_ascii();
        let asked = asked.strip_suffix('.').unwrap_or(&asked);
        if !asked.eq_ignore_ascii_case(name) || q.query_type().to_string() != record_type {
            return Ok(Err(Failure::Transient(
                "the resolver answered another question than the one asked".into(),
            )));
        }
    }
    let rcode = rcode_name(u16::from(meta.response_code));
    let mut records = Vec::new();
    let mut ttl: Option<u32> = None;
    let wanted = message
        .answers
        .iter()
        .filter(|r| r.record_type().to_string() == record_type);
    for record in wanted {
        if records.len() == MAX_RECORDS {
            let n = message
                .answers
                .iter()
                .filter(|r| r.record_type().to_string() == record_type)
                .count();
            return Ok(Err(Failure::Bounded(format!(
                "the answer holds {n} {record_type} records, more than the {MAX_RECORDS} waitd reads"
            ))));
        }
        let text = text(&record.data);
        if text.len() > MAX_RECORD_LEN {
            return Ok(Err(Failure::Bounded(format!(
                "the answer holds a {record_type} record of {} bytes, more than the {MAX_RECORD_LEN} waitd reads",
                text.len()
            ))));
        }
        ttl = Some(ttl.map_or(record.ttl, |t| t.min(record.ttl)));
        records.push(text);
    }
    records.sort();
    records.dedup();
    Ok(Ok(Answer {
        rcode,
        records,
        ttl,
        tcp: false,
    }))
}

/// A record's data as text.
fn text(data: &RData) -> String {
    let name = |n: &Name| {
        let s = n.to_ascii().to_ascii_lowercase();
        match s.strip_suffix('.') {
            Some(t) if !t.is_empty() => t.to_string(),
            _ => s,
        }
    };
    match data {
        RData::A(a) => a.0.to_string(),
        RData::AAAA(a) => a.0.to_string(),
        RData::CNAME(n) => name(&n.0),
        RData::NS(n) => name(&n.0),
        RData::MX(mx) => format!("{} {}", mx.preference, name(&mx.exchange)),
        RData::SRV(srv) => format!(
            "{} {} {} {}",
            srv.priority,
            srv.weight,
            srv.port,
            name(&srv.target)
        ),
        RData::TXT(txt) => txt
            .txt_data
            .iter()
            .map(|s| String::from_utf8_lossy(s))
            .collect(),
        other => other.to_string(),
    }
}

/// A response code's mnemonic (RFC 1035, 2136, 6895).
pub fn rcode_name(code: u16) -> String {
    match code {
        0 => "NOERROR".into(),
        1 => "FORMERR".into(),
        2 => "SERVFAIL".into(),
        3 => "NXDOMAIN".into(),
        4 => "NOTIMP".into(),
        5 => "REFUSED".into(),
        6 => "YXDOMAIN".into(),
        7 => "YXRRSET".into(),
        8 => "NXRRSET".into(),
        9 => "NOTAUTH".into(),
        10 => "NOTZONE".into(),
        n => format!("RCODE{n}"),
    }
}
