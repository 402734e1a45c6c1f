//! A DNS server scripted by the tests, on 127.0.0.1 (UDP and TCP on one port):
//! each question (name and type) answers its turns in order, the last one
//! repeating; a question not scripted is NXDOMAIN. It counts the queries it
//! hears on each transport.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, CNAME, MX, NS, SRV, TXT};
use hickory_proto::rr::{Name, RData, Record};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UdpSocket};

/// One answer to a question.
#[derive(Clone, Debug)]
pub(crate) enum Says {
    /// NOERROR with these records, written as text in the question's type.
    Records(Vec<String>),
    /// This response code, no records.
    Rcode(u8),
    /// Over UDP a truncated answer; over TCP these records.
    Truncated(Vec<String>),
    /// Over UDP a truncated answer; over TCP this many A records.
    Many(usize),
    /// No answer at all.
    Silent,
    /// An answer of junk bytes after the question's id.
    Junk,
}

/// A question: its name and its record type.
type Asked = (String, String);

#[derive(Clone, Default)]
pub(crate) struct Dns {
    script: Arc<Mutex<HashMap<Asked, Vec<Says>>>>,
    /// What each question last got over UDP, which TCP repeats.
    last: Arc<Mutex<HashMap<Asked, Says>>>,
    pub udp: Arc<AtomicUsize>,
    pub tcp: Arc<AtomicUsize>,
}

impl Dns {
    /// Serves on a free port of 127.0.0.1, UDP and TCP; its address.
    pub(crate) async fn start(&self) -> SocketAddr {
        let (udp, tcp) = loop {
            let udp = UdpSocket::bind("127.0.0.1:0").await.unwrap();
            if let Ok(tcp) = TcpListener::bind(udp.local_addr().unwrap()).await {
                break (udp, tcp);
            }
        };
        let addr = udp.local_addr().unwrap();
        let me = self.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            while let Ok((n, from)) = udp.recv_from(&mut buf).await {
                me.udp.fetch_add(1, SeqCst);
                if let Some(answer) = me.answer(&buf[..n], false) {
                    let _ = udp.send_to(&answer, from).await;
                }
            }
        });
        let me = self.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = tcp.accept().await {
                let me = me.clone();
                tokio::spawn(async move {
                    let mut len = [0u8; 2];
                    if stream.read_exact(&mut len).await.is_err() {
                        return;
                    }
                    let mut query = vec![0u8; usize::from(u16::from_be_bytes(len))];
                    if stream.read_exact(&mut query).await.is_err() {
                        return;
                    }
                    me.tcp.fetch_add(1, SeqCst);
                    if let Some(answer) = me.answer(&query, true) {
                        let mut framed = (answer.len() as u16).to_be_bytes().to_vec();
                        framed.extend_from_slice(&answer);
                        let _ = stream.write_all(&framed).await;
                    }
                });
            }
        });
        addr
    }

    /// Scripts the answers to `name`'s `record_type` question.
    pub(crate) fn says(&self, name: &str, record_type: &str, turns: Vec<Says>) {
        self.script
            .lock()
            .unwrap()
            .insert((name.to_string(), record_type.to_string()), turns);
    }

    /// Queries heard, both transports.
    pub(crate) fn queries(&self) -> usize {
        self.udp.load(SeqCst) + self.tcp.load(SeqCst)
    }

    fn answer(&self, query: &[u8], tcp: bool) -> Option<Vec<u8>> {
        let query = Message::from_vec(query).ok()?;
        let q = query.queries.first()?.clone();
        let name = q.name().to_ascii();
        let name = name.trim_end_matches('.').to_string();
        let rtype = q.query_type().to_string();
        let key = (name.clone(), rtype.clone());
        let says = if tcp {
            self.last.lock().unwrap().get(&key).cloned()
        } else {
            let mut script = self.script.lock().unwrap();
            let says = match script.get_mut(&key) {
                None => None,
                Some(turns) if turns.len() > 1 => Some(turns.remove(0)),
                Some(turns) => Some(turns[0].clone()),
            };
            if let Some(s) = &says {
                self.last.lock().unwrap().insert(key, s.clone());
            }
            says
        };
        let id = query.metadata.id;
        let mut m = Message::new(id, MessageType::Response, OpCode::Query);
        m.metadata.recursion_desired = true;
        m.metadata.recursion_available = true;
        m.add_query(q.clone());
        let records = |values: &[String]| -> Vec<Record> {
            values
                .iter()
                .map(|v| Record::from_rdata(q.name().clone(), 60, rdata(&rtype, v)))
                .collect()
        };
        match says.unwrap_or(Says::Rcode(3)) {
            Says::Records(values) => {
                m.add_answers(records(&values));
            }
            Says::Rcode(code) => m.metadata.response_code = ResponseCode::from(0, code),
            Says::Truncated(values) if tcp => {
                m.add_answers(records(&values));
            }
            Says::Many(n) if tcp => {
                let values: Vec<String> = (0..n)
                    .map(|i| format!("10.0.{}.{}", i / 250, i % 250 + 1))
                    .collect();
                m.add_answers(records(&values));
            }
            Says::Truncated(_) | Says::Many(_) => m.metadata.truncation = true,
            Says::Silent => return None,
            Says::Junk => {
                let mut junk = id.to_be_bytes().to_vec();
                junk.extend_from_slice(&[0xff; 40]);
                return Some(junk);
            }
        }
        m.to_vec().ok()
    }
}

/// A record's data from its text, as waitd reads it back.
fn rdata(rtype: &str, v: &str) -> RData {
    let name = |s: &str| Name::from_ascii(format!("{s}.")).unwrap();
    let words: Vec<&str> = v.split(' ').collect();
    match rtype {
        "A" => RData::A(A(v.parse().unwrap())),
        "AAAA" => RData::AAAA(AAAA(v.parse().unwrap())),
        "CNAME" => RData::CNAME(CNAME(name(v))),
        "NS" => RData::NS(NS(name(v))),
        "MX" => RData::MX(MX::new(words[0].parse().unwrap(), name(words[1]))),
        "SRV" => RData::SRV(SRV::new(
            words[0].parse().unwrap(),
            words[1].parse().unwrap(),
            words[2].parse().unwrap(),
            name(words[3]),
        )),
        // A TXT string is at most 255 bytes: a longer text is several.
        "TXT" => RData::TXT(TXT::new(
            v.as_bytes()
                .chunks(255)
                .map(|c| String::from_utf8_lossy(c).into_owned())
                .collect(),
        )),
        other => panic!("the scripted server does not answer {other}"),
    }
}
