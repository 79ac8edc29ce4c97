//! The configuration store on a real etcd server, started here on
//! 127.0.0.1 with a temporary data directory and stopped by its pid.
//! Without an etcd binary the tests say so and pass, unless
//! `LOCH_REQUIRE_ETCD` is set (CI sets it, after installing etcd).

use bootstrap::etcd::{etcd_binary, EtcdStore, LocalEtcd, DEFAULT_KEY};
use std::time::Duration;
use txn::config::{conformance, ConfigError, ConfigStore, Swap};

fn etcd() -> Option<LocalEtcd> {
    if etcd_binary().is_none() {
        assert!(
            std::env::var_os("LOCH_REQUIRE_ETCD").is_none(),
            "LOCH_REQUIRE_ETCD is set and no etcd binary was found"
        );
        eprintln!("skipped: no etcd binary (install etcd-server or set LOCH_ETCD)");
        return None;
    }
    Some(LocalEtcd::start(Duration::from_secs(20)).expect("etcd starts"))
}

#[test]
fn etcd_passes_the_store_conformance_checks() {
    let Some(e) = etcd() else { return };
    // Each check on a key of its own: a fresh, empty store.
    conformance::swaps_follow_revisions_and_numbers(&e.store("/t/swaps").unwrap());
    conformance::invalid_configurations_are_refused(&e.store("/t/invalid").unwrap());
    conformance::one_of_many_concurrent_swaps_of_a_revision_wins(&e.store("/t/race").unwrap());
    // Two stores on one server do not see each other's configuration.
    assert_eq!(e.store(DEFAULT_KEY).unwrap().read().unwrap(), None);
}

#[test]
fn etcd_revisions_survive_a_new_client_and_competing_clients() {
    let Some(e) = etcd() else { return };
    let a = e.store("/t/shared").unwrap();
    let b = e.store("/t/shared").unwrap();
    let Swap::Done(r1) = a.cas(None, &conformance::conf(1, &[0, 1, 2], 0)).unwrap() else {
        panic!("not stored")
    };
    // b read nothing before a's swap: its first configuration loses and
    // learns a's.
    match b.cas(None, &conformance::conf(1, &[0, 1], 1)).unwrap() {
        Swap::Lost(Some(s)) => {
            assert_eq!(s.revision, r1);
            assert_eq!(s.config.cm, 0);
        }
        other => panic!("{other:?}"),
    }
    let Swap::Done(r2) = b.cas(Some(r1), &conformance::conf(2, &[1, 2], 1)).unwrap() else {
        panic!("not stored")
    };
    // a, now stale, loses and is told the newer configuration.
    assert!(matches!(
        a.cas(Some(r1), &conformance::conf(2, &[0, 2], 2)).unwrap(),
        Swap::Lost(Some(s)) if s.revision == r2 && s.config.cm == 1
    ));
}

/// A value under the key that is no configuration is an error, not one;
/// a store that cannot be reached is an error naming it.
#[test]
fn corrupt_values_and_unreachable_stores_are_clear_errors() {
    let Some(e) = etcd() else { return };
    // Put raw bytes through the gateway itself, as another writer might.
    use base64::Engine as _;
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let body = format!(
        r#"{{"key":"{}","value":"{}"}}"#,
        b64(b"/t/corrupt"),
        b64(b"not a configuration")
    );
    let mut resp = ureq::post(format!("{}/v3/kv/put", e.endpoint()))
        .send(body)
        .expect("the gateway takes a put");
    assert!(
        resp.status().is_success(),
        "{:?}",
        resp.body_mut().read_to_string()
    );
    let s = e.store("/t/corrupt").unwrap();
    assert!(
        matches!(s.read(), Err(ConfigError::Corrupt(_))),
        "{:?}",
        s.read()
    );
    assert!(s.cas(Some(1), &conformance::conf(1, &[0], 0)).is_err());

    let endpoint = e.endpoint().to_string();
    drop(e); // the server is stopped by its pid
    let gone = EtcdStore::new(&endpoint, DEFAULT_KEY, Duration::from_millis(500)).unwrap();
    match gone.read() {
        Err(ConfigError::Store(msg)) => assert!(msg.contains(&endpoint), "{msg}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        gone.cas(None, &conformance::conf(1, &[0], 0)),
        Err(ConfigError::Store(_))
    ));
    assert!(EtcdStore::new("https://x", DEFAULT_KEY, Duration::from_secs(1)).is_err());
}

/// FaRM's reconfiguration with etcd as the store: the CM of a simulated
/// cluster crashes, its first backup commits the next configuration to
/// etcd by compare-and-swap, and the other backups learn it from etcd.
#[test]
fn a_new_cm_commits_its_configuration_to_etcd() {
    use nicdrv::sim::{Fault, FaultKind, SimModel};
    use std::sync::Arc;
    use txn::harness::{run_leases_sim, LeaseSim};
    use txn::reconfig::Event;
    let Some(e) = etcd() else { return };
    let store = Arc::new(e.store(DEFAULT_KEY).unwrap());
    let g = txn::Geometry {
        machines: 5,
        threads: 1,
        f: 2,
        regions_per_machine: 1,
        spare_regions_per_machine: 0,
        region_bytes: 64 << 10,
        static_bytes: 64 << 10,
        block_bytes: 1 << 20,
        log_bytes: 64 << 10,
        reply_bytes: 4 << 10,
    };
    let r = run_leases_sim(
        g,
        7,
        SimModel::default(),
        &LeaseSim {
            faults: vec![Fault {
                at_ns: 15_000_000,
                kind: FaultKind::CrashMachine { machine: 0 },
            }],
            store: Some(store.clone()),
            ..LeaseSim::of(10_000_000, 50_000_000)
        },
    )
    .unwrap();
    let stored = store.read().unwrap().unwrap();
    assert_eq!(stored.config.id, 2);
    assert_eq!(stored.config.cm, 1);
    assert_eq!(
        stored.config.machines,
        (1..5).map(|m| (m, m as u32)).collect::<Vec<_>>()
    );
    let commits: usize = r
        .reconfig
        .iter()
        .map(|(_, ev)| {
            ev.as_ref()
                .unwrap()
                .iter()
                .filter(|x| matches!(x, Event::Committed { .. }))
                .count()
        })
        .sum();
    assert_eq!(commits, 1, "{:?}", r.reconfig);
}

/// Marks beside a configuration are listed by prefix, apart from the
/// configuration and from another cluster's marks.
#[test]
fn marks_beside_a_configuration_are_listed_by_prefix() {
    let Some(e) = etcd() else { return };
    let a = e.store("/t/marks").unwrap();
    let other = e.store("/t/marks2").unwrap();
    assert!(a.marks("checked/2/").unwrap().is_empty());
    let Swap::Done(_) = a.cas(None, &conformance::conf(1, &[0, 1, 2], 0)).unwrap() else {
        panic!("not stored")
    };
    a.mark("checked/2/0").unwrap();
    a.mark("checked/2/1").unwrap();
    a.mark("checked/3/1").unwrap();
    other.mark("checked/2/2").unwrap();
    let mut got = a.marks("checked/2/").unwrap();
    got.sort();
    assert_eq!(got, ["checked/2/0", "checked/2/1"]);
    assert_eq!(other.marks("checked/").unwrap(), ["checked/2/2"]);
    // The configuration is untouched by its marks.
    assert_eq!(a.read().unwrap().unwrap().config.id, 1);
}
