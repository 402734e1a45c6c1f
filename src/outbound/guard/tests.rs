use super::*;

fn guard(entries: &[&str]) -> Guard {
    Guard::new(&entries.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn public_addresses_have_no_reason_to_be_refused() {
    for a in [
        "8.8.8.8",
        "1.1.1.1",
        "2606:4700::1111",
        "::ffff:8.8.8.8",
        "64:ff9b::808:808",
    ] {
        assert_eq!(forbidden_reason(ip(a)), None, "{a}");
    }
}

#[test]
fn every_internal_range_has_a_reason() {
    for (a, words) in [
        ("127.0.0.1", "loopback"),
        ("127.255.0.9", "loopback"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("172.31.255.255", "private"),
        ("192.168.1.1", "private"),
        ("169.254.169.254", "metadata"),
        ("169.254.1.1", "link-local"),
        ("100.64.0.1", "carrier-grade NAT"),
        ("100.127.255.254", "carrier-grade NAT"),
        ("224.0.0.1", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("0.1.2.3", "this host"),
        ("255.255.255.255", "broadcast"),
        ("240.0.0.1", "reserved"),
        ("198.18.0.1", "benchmarking"),
        ("::", "unspecified"),
        ("::1", "loopback"),
        ("fe80::1", "link-local"),
        ("fc00::1", "unique-local"),
        ("fd00:ec2::254", "unique-local"),
        ("fec0::1", "site-local"),
        ("ff02::1", "multicast"),
        ("::ffff:127.0.0.1", "loopback"),
        ("::ffff:169.254.169.254", "metadata"),
        ("::127.0.0.1", "loopback"),
        ("64:ff9b::a00:1", "private"),
        ("2002:7f00:1::", "loopback"),
    ] {
        let reason = forbidden_reason(ip(a)).unwrap_or_else(|| panic!("{a} let through"));
        assert!(reason.contains(words), "{a}: {reason}");
    }
}

#[test]
fn the_edges_of_ranges_are_where_they_should_be() {
    assert_eq!(forbidden_reason(ip("172.32.0.1")), None);
    assert_eq!(forbidden_reason(ip("100.128.0.1")), None);
    assert_eq!(forbidden_reason(ip("11.0.0.1")), None);
    assert_eq!(forbidden_reason(ip("fe00::1")), None);
}

#[test]
fn allow_list_entries_parse_into_what_they_name() {
    let g = guard(&[
        " api.internal ",
        "*.svc.local",
        "127.0.0.1",
        "[::1]",
        "10.0.0.0/8",
        "fd00::/8",
        "EXAMPLE.org.",
        "",
    ]);
    assert!(g.allows_host("api.internal"));
    assert!(g.allows_host("API.internal."));
    assert!(!g.allows_host("x.api.internal"));
    assert!(g.allows_host("a.svc.local"));
    assert!(g.allows_host("a.b.svc.local"));
    assert!(!g.allows_host("svc.local"));
    assert!(!g.allows_host("evilsvc.local"));
    assert!(g.allows_host("example.org"));
    assert!(g.allows_ip(ip("127.0.0.1")));
    assert!(g.allows_ip(ip("::ffff:127.0.0.1")));
    assert!(!g.allows_ip(ip("127.0.0.2")));
    assert!(g.allows_ip(ip("::1")));
    assert!(g.allows_ip(ip("10.200.0.1")));
    assert!(!g.allows_ip(ip("11.0.0.1")));
    assert!(g.allows_ip(ip("fd12::1")));
    assert!(!g.allows_ip(ip("fc00::1")));
}

#[test]
fn a_cidr_with_host_bits_set_means_its_network() {
    let g = guard(&["192.168.1.77/24"]);
    assert!(g.allows_ip(ip("192.168.1.1")));
    assert!(!g.allows_ip(ip("192.168.2.1")));
    let all = guard(&["0.0.0.0/0", "::/0"]);
    assert!(all.allows_ip(ip("127.0.0.1")));
    assert!(all.allows_ip(ip("::1")));
}

#[test]
fn malformed_allow_list_entries_are_refused_with_the_entry_named() {
    for (entry, words) in [
        ("http://api.internal", "is a URL"),
        ("*", "every host"),
        ("10.0.0.0/33", "at most 32"),
        ("::/129", "at most 128"),
        ("10.0.0.0/x", "CIDR"),
        ("api.internal:8080", "no scheme or port"),
        ("*.10.0.0.1", "wildcard"),
        ("a b", "not a host name"),
    ] {
        let err = Guard::new(&[entry.to_string()]).unwrap_err().to_string();
        assert!(err.contains(entry), "{entry}: {err}");
        assert!(err.contains(words), "{entry}: {err}");
    }
}

#[test]
fn an_odd_ipv4_spelling_in_the_allow_list_means_its_address() {
    let g = guard(&["2130706433"]);
    assert!(g.allows_ip(ip("127.0.0.1")));
}

#[test]
fn check_ip_refuses_forbidden_addresses_unless_the_host_or_address_is_allowed() {
    let g = guard(&["trusted.internal", "10.9.0.0/16"]);
    let err = g
        .check_ip("evil.test", ip("127.0.0.1"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("evil.test") && err.contains("loopback"),
        "{err}"
    );
    assert!(err.contains("--allow-targets"), "{err}");
    assert!(g.check_ip("trusted.internal", ip("10.1.1.1")).is_ok());
    assert!(g.check_ip("other.test", ip("10.9.1.1")).is_ok());
    assert!(g.check_ip("other.test", ip("10.8.1.1")).is_err());
    assert!(g.check_ip("public.test", ip("8.8.8.8")).is_ok());
}

#[tokio::test]
async fn the_resolver_drops_forbidden_addresses_and_keeps_the_rest() {
    let g = Arc::new(guard(&["127.0.0.1"]));
    let r = GuardedResolver::new(
        g,
        &[
            ("Mixed.test".to_string(), "10.0.0.1:0".parse().unwrap()),
            ("mixed.test".to_string(), "127.0.0.1:0".parse().unwrap()),
            ("mixed.test".to_string(), "8.8.8.8:0".parse().unwrap()),
            (
                "evil.test".to_string(),
                "169.254.169.254:0".parse().unwrap(),
            ),
            ("evil.test".to_string(), "[::1]:0".parse().unwrap()),
        ],
    );
    let kept = r.resolve_host("mixed.test.").await.unwrap();
    assert_eq!(
        kept,
        vec![
            "127.0.0.1:0".parse::<SocketAddr>().unwrap(),
            "8.8.8.8:0".parse().unwrap()
        ]
    );
    let err = r.resolve_host("evil.test").await.unwrap_err();
    assert!(matches!(err, ResolveError::Forbidden { .. }));
    let text = err.to_string();
    assert!(
        text.contains("the host evil.test resolves only to forbidden addresses"),
        "{text}"
    );
    assert!(
        text.contains("metadata") && text.contains("::1 is a loopback"),
        "{text}"
    );
}

#[tokio::test]
async fn the_resolver_lets_an_allowed_name_reach_an_internal_address() {
    let g = Arc::new(guard(&["db.internal"]));
    let r = GuardedResolver::new(g, &[("db.internal".into(), "10.0.0.5:0".parse().unwrap())]);
    assert_eq!(r.resolve_host("db.internal").await.unwrap().len(), 1);
}

#[tokio::test]
async fn the_resolver_judges_what_the_system_resolver_answers() {
    // `localhost` resolves through the system resolver to loopback only.
    let r = GuardedResolver::new(Arc::new(Guard::default()), &[]);
    match r.resolve_host("localhost").await {
        Err(ResolveError::Forbidden { .. }) | Err(ResolveError::Lookup { .. }) => {}
        other => panic!("localhost was let through: {other:?}"),
    }
}
