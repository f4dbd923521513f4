//! Fleet routing end to end: real `tensorgate worker` processes behind gateways (in-process
//! or `tensorgate serve` processes). Sequence affinity across replicas, membership changes
//! (reload, a dead worker, DNS), the `timeout` parameter, the pin table, and config reloads.

use crate::common_fleet;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common_fleet::*;
use serde_json::json;
use tensorgate::protocol::SequenceId;
use tensorgate::routing::sequence_key;
use tensorgate::run::Running;

const SEQ_MODELS: &[&str] = &["simple", "accumulate"];

/// The names of the backends that have `model` ready, from the gateway's catalog.
fn ready_backends(gw: &Running, model: &str) -> BTreeSet<String> {
    gw.gateway
        .fleet
        .catalog()
        .get(model)
        .map(|e| e.ready.iter().map(|h| h.name.to_string()).collect())
        .unwrap_or_default()
}

fn backend_names(gw: &Running) -> BTreeSet<String> {
    gw.gateway
        .fleet
        .backends()
        .iter()
        .map(|h| h.name.to_string())
        .collect()
}

/// Sends `simple` requests until every backend in `want` has served one (at most `tries`);
/// every request must succeed. Returns the backends seen.
async fn simple_until_seen(
    client: &reqwest::Client,
    base: &str,
    want: &BTreeSet<String>,
    tries: i32,
) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for x in 0..tries {
        let r = infer_simple(client, base, x).await;
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.output_int("OUTPUT0"), Some(x as i64 + 1), "{r:?}");
        seen.insert(r.backend.expect("the backend header"));
        if want.is_subset(&seen) {
            break;
        }
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sequences_keep_one_backend_across_three_serve_processes() {
    let workers = Worker::start_many(3, SEQ_MODELS).await;
    let pairs: Vec<(&str, &str)> = workers
        .iter()
        .map(|w| (w.name.as_str(), w.url.as_str()))
        .collect();
    // Three `tensorgate serve` processes with the same backend names and URLs: nothing but
    // the hash, computed alike in each, keeps a sequence on one worker.
    let dir = TempDir::new("replicas");
    let text = gateway_toml(&pairs, "refresh_interval_ms = 200");
    let configs: Vec<PathBuf> = (0..3)
        .map(|i| {
            let path = dir.path(&format!("replica{i}.toml"));
            std::fs::write(&path, &text).expect("write a replica's config");
            path
        })
        .collect();
    let gateways = start_gateway_processes(&configs).await;
    let bases: Vec<String> = gateways.iter().map(|g| g.base.clone()).collect();

    let mut rng = fastrand::Rng::with_seed(0x5eed_0001);
    let seqs: Vec<Seq> = (1..=300)
        .map(|id| Seq::new(id, rng.usize(3..=6), &mut rng))
        .collect();
    let total_requests: usize = seqs.iter().map(|s| s.values.len()).sum();
    // Each request goes to a random replica; Seq::step checks every running sum and that
    // every request of a sequence was served by the backend of its first.
    let done = drive(seqs, &bases, 6, 0x5eed_0002, usize::MAX)
        .await
        .unwrap_or_else(|e| panic!("{e}"));

    assert_eq!(done.len(), 300);
    let mut per_backend: BTreeMap<String, usize> = BTreeMap::new();
    let mut served = 0;
    for s in &done {
        assert!(s.done(), "sequence {} did not finish", s.id);
        served += s.served_by.len();
        *per_backend.entry(s.backend.clone().unwrap()).or_default() += 1;
    }
    assert_eq!(served, total_requests);
    // The test is only worth something if sequences really hop between replicas.
    let hopping = done
        .iter()
        .filter(|s| s.via.iter().collect::<BTreeSet<_>>().len() > 1)
        .count();
    assert!(
        hopping >= 250,
        "only {hopping} sequences used more than one replica"
    );
    let names: BTreeSet<String> = workers.iter().map(|w| w.name.clone()).collect();
    assert_eq!(
        per_backend.keys().cloned().collect::<BTreeSet<_>>(),
        names,
        "the hash spreads sequences over all workers: {per_backend:?}"
    );
    drop(gateways);
}

/// A `sequence_id` sent to a model whose backends state it keeps no sequence state (the
/// workers' `simple`; tritonclient sends one to any model it is given) pins nothing: the
/// sequence's requests are balanced like any others. One sent to `accumulate`, a sequence
/// model, is pinned, and a request to it without one is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_model_that_keeps_sequence_state_pins_its_sequences() {
    let workers = Worker::start_many(2, SEQ_MODELS).await;
    let gw = start_gateway(gateway_config(
        &workers.iter().collect::<Vec<_>>(),
        "refresh_interval_ms = 200",
    ))
    .await;
    let (b, client) = (base(&gw), http_client());
    let catalog = gw.gateway.fleet.catalog();
    let stateless = |m: &str| catalog.get(m).map(|e| e.stateless);
    assert_eq!(
        (stateless("simple"), stateless("accumulate")),
        (Some(true), Some(false))
    );
    let mut seen = BTreeSet::new();
    for x in 0..40 {
        let mut parameters = json!({"sequence_id": 7});
        if x == 0 {
            parameters["sequence_start"] = json!(true);
        }
        let r = post_infer(&client, &b, "simple", &simple_body(x, Some(parameters))).await;
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.output_int("OUTPUT0"), Some(x as i64 + 1), "{r:?}");
        seen.insert(r.backend.expect("the backend header"));
    }
    assert_eq!(seen.len(), 2, "40 requests went to {seen:?} only");
    assert_eq!(gw.gateway.router.pins.len(), 0);
    // Every backend says accumulate keeps sequence state: a request without an id is the
    // gateway's 400, in Triton's words, and reaches no backend.
    let bare =
        json!({"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1], "data": [1]}]});
    let r = post_infer(&client, &b, "accumulate", &bare).await;
    assert_eq!(
        (r.status, r.error(), r.backend.as_deref()),
        (
            400,
            Some("inference request to model 'accumulate' must specify a non-zero or non-empty correlation ID"),
            None
        ),
        "{r:?}"
    );
    let first = accumulate(&client, &b, 7, true, false, 5).await;
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(gw.gateway.router.pins.len(), 1);
    for _ in 0..10 {
        let r = accumulate(&client, &b, 7, false, false, 1).await;
        assert_eq!((r.status, &r.backend), (200, &first.backend), "{r:?}");
    }
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_added_by_reload_takes_new_sequences_while_live_ones_stay() {
    let workers = Worker::start_many(4, SEQ_MODELS).await;
    let fleet = "refresh_interval_ms = 200";
    let first3: Vec<&Worker> = workers[..3].iter().collect();
    let all4: Vec<&Worker> = workers.iter().collect();
    let gw = start_gateway(gateway_config(&first3, fleet)).await;
    let bases = vec![base(&gw)];

    // 60 live sequences: a start and one more request each, before the reload.
    let mut rng = fastrand::Rng::with_seed(0x5eed_0003);
    let live: Vec<Seq> = (1..=60).map(|id| Seq::new(id, 5, &mut rng)).collect();
    let live = drive(live, &bases, 3, 0x5eed_0004, 2)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(live.iter().all(|s| s.next == 2));
    assert_eq!(gw.gateway.router.pins.len(), 60);

    gw.reload(gateway_config(&all4, fleet))
        .await
        .expect("the reload applies");
    assert_eq!(
        ready_backends(&gw, "accumulate"),
        workers.iter().map(|w| w.name.clone()).collect(),
        "the reload refreshes the new worker before returning"
    );

    // Only the pins keep some of them in place: by the new table they belong elsewhere.
    let catalog = gw.gateway.fleet.catalog();
    let entry = catalog.get("accumulate").unwrap();
    let moved = live
        .iter()
        .filter(|s| {
            let key = sequence_key("accumulate", &SequenceId::Uint(s.id));
            let owner = &entry.ready[entry.table.lookup(key).unwrap()].name;
            Some(&**owner) != s.backend.as_deref()
        })
        .count();
    assert!(
        moved > 0,
        "some live sequences hash to another backend after the reload"
    );

    // The live sequences finish, interleaved with 100 new ones.
    let fresh: Vec<Seq> = (1001..=1100).map(|id| Seq::new(id, 3, &mut rng)).collect();
    let mut all = live.clone();
    all.extend(fresh);
    let done = drive(all, &bases, 4, 0x5eed_0005, usize::MAX)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    for s in &done {
        assert!(s.done(), "sequence {} did not finish", s.id);
    }
    for (before, after) in live.iter().zip(done.iter().filter(|s| s.id <= 60)) {
        assert_eq!(before.id, after.id);
        assert_eq!(
            before.backend, after.backend,
            "live sequence {} moved",
            before.id
        );
        assert_ne!(after.backend.as_deref(), Some("w3"));
    }
    let on_new = done
        .iter()
        .filter(|s| s.id > 1000 && s.backend.as_deref() == Some("w3"))
        .count();
    assert!(on_new > 0, "no new sequence reached the added worker");
    // Every sequence ended on this one replica, so no pin is left.
    assert_eq!(gw.gateway.router.pins.len(), 0);

    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_worker_loses_only_its_own_sequences() {
    let mut workers = Worker::start_many(3, SEQ_MODELS).await;
    let gw = {
        let refs: Vec<&Worker> = workers.iter().collect();
        start_gateway(gateway_config(&refs, "refresh_interval_ms = 200")).await
    };
    let b = base(&gw);
    let client = http_client();

    // Warm up, so the gateway holds pooled connections to the workers.
    for x in 0..30 {
        let r = infer_simple(&client, &b, x).await;
        assert_eq!(r.status, 200, "{r:?}");
    }
    let mut rng = fastrand::Rng::with_seed(0x5eed_0006);
    let seqs: Vec<Seq> = (1..=60).map(|id| Seq::new(id, 4, &mut rng)).collect();
    let seqs = drive(seqs, std::slice::from_ref(&b), 3, 0x5eed_0007, 2)
        .await
        .unwrap_or_else(|e| panic!("{e}"));

    let victim_name = seqs[0].backend.clone().unwrap();
    let victim = workers.iter().position(|w| w.name == victim_name).unwrap();
    let victim_url = workers[victim].url.clone();
    workers[victim].process.kill();

    // Outside a sequence nothing fails, not even right after the kill: a refused connection
    // is retried on another backend.
    for x in 0..40 {
        let r = infer_simple(&client, &b, x).await;
        assert_eq!(r.status, 200, "request {x} after the kill: {r:?}");
        assert_eq!(r.output_int("OUTPUT0"), Some(x as i64 + 1));
        assert_ne!(r.backend.as_deref(), Some(victim_name.as_str()));
    }

    // Sequences pinned to the dead worker are lost, with a 503 that says so: half of them
    // right away (the gateway may still list the worker), half once the refresh has dropped
    // it from the catalog.
    let (lost, survivors): (Vec<Seq>, Vec<Seq>) = seqs
        .into_iter()
        .partition(|s| s.backend.as_deref() == Some(victim_name.as_str()));
    assert!(lost.len() >= 2, "too few sequences on the victim to test");
    assert!(!survivors.is_empty());
    let expect_lost = |s: Seq| {
        let (client, b, victim_url) = (client.clone(), b.clone(), victim_url.clone());
        async move {
            let r = accumulate(&client, &b, s.id, false, false, s.values[2]).await;
            assert_eq!(r.status, 503, "sequence {}: {r:?}", s.id);
            // Refused by the connection (the gateway still listed it), or by routing (the
            // worker has left this replica's list).
            let head = format!(
                "the backend of sequence {} of model 'accumulate' ({victim_url})",
                s.id
            );
            let wants = [
                format!("{head} is unavailable; the sequence's state is lost"),
                format!("{head} is not available to this replica (unhealthy, ejected, or not in its fleet); if it is gone, the sequence's state is lost"),
            ];
            assert!(wants.iter().any(|w| r.error() == Some(w.as_str())), "{r:?}");
        }
    };
    let (early, late) = lost.split_at(lost.len() / 2);
    for s in early {
        expect_lost(s.clone()).await;
    }

    // Every other sequence completes correctly on its own backend.
    let survivors_count = survivors.len();
    let done = drive(
        survivors,
        std::slice::from_ref(&b),
        3,
        0x5eed_0008,
        usize::MAX,
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(done.len(), survivors_count);
    assert!(done.iter().all(Seq::done));

    // New sequences avoid the dead worker.
    let fresh: Vec<Seq> = (2001..=2040).map(|id| Seq::new(id, 3, &mut rng)).collect();
    let fresh = drive(fresh, std::slice::from_ref(&b), 2, 0x5eed_0009, usize::MAX)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    for s in &fresh {
        assert!(s.done());
        assert_ne!(s.backend.as_deref(), Some(victim_name.as_str()));
    }

    // The refresh drops the dead worker from the catalog; requests keep succeeding.
    let gwr = &gw;
    let vn = victim_name.clone();
    assert!(
        eventually(100, Duration::from_millis(100), || {
            let vn = vn.clone();
            async move {
                let ready = ready_backends(gwr, "simple");
                ready.len() == 2 && !ready.contains(&vn)
            }
        })
        .await,
        "the dead worker stays in the catalog"
    );
    for x in 0..20 {
        let r = infer_simple(&client, &b, x).await;
        assert_eq!(r.status, 200, "{r:?}");
    }
    for s in late {
        expect_lost(s.clone()).await;
    }
    // A lost sequence can start over, on a live worker.
    let restarted: Vec<Seq> = lost.iter().map(|s| Seq::new(s.id, 3, &mut rng)).collect();
    let restarted = drive(
        restarted,
        std::slice::from_ref(&b),
        2,
        0x5eed_000a,
        usize::MAX,
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    for s in &restarted {
        assert!(s.done());
        assert_ne!(s.backend.as_deref(), Some(victim_name.as_str()));
    }
    assert_eq!(gw.gateway.router.pins.len(), 0);
    let r = client
        .get(format!("{b}/v2/health/ready"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    drop(client);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dns_discovery_follows_the_addresses_of_a_name() {
    let ips = ["127.0.0.2", "127.0.0.3", "127.0.0.4"];
    let port = free_port_on_all(&ips);
    let mut workers = Vec::new();
    for ip in ips {
        workers.push(Worker::start(ip, ip, port, &["simple"]).await);
    }
    let resolver = MutableResolver::default();
    resolver.set("workers.test", &ips[..2]);
    let gw = start_dns_gateway(
        "refresh_interval_ms = 200\ndns_interval_ms = 200",
        port,
        Arc::new(resolver.clone()),
    )
    .await;
    let b = base(&gw);
    let client = http_client();
    let name = |ip: &str| format!("pool/{ip}:{port}");
    let set = |list: &[&str]| list.iter().map(|ip| name(ip)).collect::<BTreeSet<_>>();

    assert_eq!(backend_names(&gw), set(&ips[..2]));
    let keys: BTreeSet<String> = gw
        .gateway
        .fleet
        .backends()
        .iter()
        .map(|h| h.key.clone())
        .collect();
    assert_eq!(
        keys,
        ips[..2]
            .iter()
            .map(|ip| format!("http://{ip}:{port}"))
            .collect()
    );
    assert_eq!(ready_backends(&gw, "simple"), set(&ips[..2]));
    let seen = simple_until_seen(&client, &b, &set(&ips[..2]), 300).await;
    assert_eq!(seen, set(&ips[..2]), "traffic reaches both addresses");

    // A third address appears in DNS: it becomes a backend and takes traffic.
    resolver.set("workers.test", &ips);
    let gwr = &gw;
    let all = set(&ips);
    assert!(
        eventually(100, Duration::from_millis(100), || {
            let all = all.clone();
            async move { backend_names(gwr) == all && ready_backends(gwr, "simple") == all }
        })
        .await,
        "the new address did not become a ready backend: {:?}",
        backend_names(&gw)
    );
    let seen = simple_until_seen(&client, &b, &set(&ips[2..]), 300).await;
    assert!(
        seen.contains(&name(ips[2])),
        "traffic reaches the new address"
    );

    // An address that leaves DNS stops being a backend.
    resolver.set("workers.test", &ips[1..]);
    let rest = set(&ips[1..]);
    assert!(
        eventually(100, Duration::from_millis(100), || {
            let rest = rest.clone();
            async move { backend_names(gwr) == rest && ready_backends(gwr, "simple") == rest }
        })
        .await,
        "the removed address is still a backend: {:?}",
        backend_names(&gw)
    );
    for x in 0..30 {
        let r = infer_simple(&client, &b, x).await;
        assert_eq!(r.status, 200, "{r:?}");
        assert_ne!(r.backend, Some(name(ips[0])));
    }

    drop(client);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_timeout_parameter_bounds_a_forwarded_request() {
    let workers = Worker::start_many(1, &["simple"]).await;
    let gw = start_gateway(gateway_config(
        &workers.iter().collect::<Vec<_>>(),
        "refresh_interval_ms = 200",
    ))
    .await;
    let b = base(&gw);
    let client = http_client();

    // One microsecond: no HTTP backend answers that fast.
    let r = post_infer(
        &client,
        &b,
        "simple",
        &simple_body(1, Some(json!({ "timeout": 1 }))),
    )
    .await;
    assert_eq!(r.status, 504, "{r:?}");
    assert_eq!(
        r.error(),
        Some("the request to model 'simple' timed out (the request's timeout parameter)")
    );

    // Ten seconds is plenty.
    let r = post_infer(
        &client,
        &b,
        "simple",
        &simple_body(1, Some(json!({ "timeout": 10_000_000 }))),
    )
    .await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.output_int("OUTPUT0"), Some(2));
    assert_eq!(r.backend.as_deref(), Some("w0"));

    // Zero means no timeout, as in Triton: the configured request timeout applies.
    let r = post_infer(
        &client,
        &b,
        "simple",
        &simple_body(1, Some(json!({ "timeout": 0 }))),
    )
    .await;
    assert_eq!(r.status, 200, "{r:?}");

    // The same holds for the in-process models, which answer on their first poll.
    let local = start_gateway(parse_config(&gateway_toml(
        &[("builtin", "builtin")],
        "refresh_interval_ms = 200",
    )))
    .await;
    let body = simple_body(1, Some(json!({ "timeout": 1 })));
    let r = post_infer(&client, &base(&local), "simple", &body).await;
    assert_eq!(r.status, 504, "{r:?}");
    assert_eq!(
        r.error(),
        Some("the request to model 'simple' timed out (the request's timeout parameter)")
    );

    drop(client);
    gw.shutdown().await;
    local.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pin_table_is_capped_expires_idle_pins_and_drops_ended_ones() {
    const IDLE: Duration = Duration::from_millis(3_000);
    let workers = Worker::start_many(2, SEQ_MODELS).await;
    let gw = start_gateway(gateway_config(
        &workers.iter().collect::<Vec<_>>(),
        &format!(
            "refresh_interval_ms = 200\nmax_sequences = 2\nsequence_idle_timeout_ms = {}",
            IDLE.as_millis()
        ),
    ))
    .await;
    let b = base(&gw);
    let client = http_client();
    let pins = &gw.gateway.router.pins;
    let pinned = |id: u64| pins.get("accumulate", &SequenceId::Uint(id));
    let mut backend_of: BTreeMap<u64, String> = BTreeMap::new();
    let send = |id: u64, start: bool, end: bool, v: i32, want: i32| {
        let client = client.clone();
        let b = b.clone();
        async move {
            let r = accumulate(&client, &b, id, start, end, v).await;
            assert_eq!(r.status, 200, "sequence {id}: {r:?}");
            assert_eq!(r.output_int("OUTPUT0"), Some(want as i64), "sequence {id}");
            (id, r.backend.unwrap())
        }
    };
    let mut same_backend = |(id, backend): (u64, String)| {
        let first = backend_of.entry(id).or_insert_with(|| backend.clone());
        assert_eq!(*first, backend, "sequence {id} moved");
    };

    same_backend(send(1, true, false, 1, 1).await);
    same_backend(send(2, true, false, 2, 2).await);
    assert_eq!(pins.len(), 2);

    // The table is full: sequence 3 is served, routed by the hash alone, and not pinned.
    same_backend(send(3, true, false, 3, 3).await);
    assert_eq!(pins.len(), 2);
    same_backend(send(3, false, false, 4, 7).await);
    assert_eq!(pins.len(), 2);
    assert_eq!(pinned(3), None);

    // sequence_end removes the pin.
    same_backend(send(1, false, true, 10, 11).await);
    assert_eq!(pins.len(), 1);
    assert_eq!(pinned(1), None);
    same_backend(send(4, true, false, 4, 4).await);
    assert_eq!(pins.len(), 2);

    // After the idle timeout and one sweep (every quarter of it), the pins of 2 and 4 are
    // gone, which makes room for a new sequence.
    tokio::time::sleep(IDLE + IDLE / 4 + Duration::from_millis(500)).await;
    same_backend(send(5, true, false, 5, 5).await);
    assert_eq!(pins.len(), 1, "idle pins were not dropped to make room");
    assert!(pinned(5).is_some());

    // Sequence 2 lost its pin but not its state: the hash finds its backend again.
    same_backend(send(2, false, false, 5, 7).await);
    assert_eq!(pins.len(), 2);
    same_backend(send(2, false, true, 1, 8).await);
    same_backend(send(3, false, true, 1, 8).await);
    same_backend(send(4, false, true, 1, 5).await);
    same_backend(send(5, false, true, 1, 6).await);
    assert_eq!(pins.len(), 0);

    drop(client);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_file_changes_and_sighup_reload_a_gateway_process() {
    let wa = Worker::start("a", "127.0.0.1", 0, &["simple"]).await;
    let wb = Worker::start("b", "127.0.0.1", 0, &["simple", "classifier"]).await;
    let wc = Worker::start("c", "127.0.0.1", 0, &["simple", "accumulate"]).await;
    let dir = TempDir::new("reload");
    let client = http_client();

    // A gateway that watches its config file.
    let watched = dir.path("watched.toml");
    let fleet = "refresh_interval_ms = 200\nwatch_config = true";
    write_atomically(&watched, &gateway_toml(&[("a", &wa.url)], fleet));
    // A gateway that only reloads on SIGHUP.
    let hup = dir.path("hup.toml");
    let fleet_hup = "refresh_interval_ms = 200\nwatch_config = false";
    write_atomically(&hup, &gateway_toml(&[("a", &wa.url)], fleet_hup));
    let g1 = GatewayProcess::start(&watched, dir.path("watched.log")).await;
    let g2 = GatewayProcess::start(&hup, dir.path("hup.log")).await;
    for g in [&g1, &g2] {
        assert_eq!(ready_models(&client, &g.base).await, vec!["simple"]);
    }

    write_atomically(
        &watched,
        &gateway_toml(&[("a", &wa.url), ("b", &wb.url)], fleet),
    );
    let (c, base1) = (&client, g1.base.as_str());
    assert!(
        eventually(150, Duration::from_millis(100), || async move {
            ready_models(c, base1)
                .await
                .contains(&"classifier".to_string())
        })
        .await,
        "the file change was not picked up; log:\n{}",
        g1.log_text()
    );
    let seen = simple_until_seen(&client, &g1.base, &["b".to_string()].into(), 200).await;
    assert!(seen.contains("b"), "the added backend takes traffic");
    assert!(
        log_comes_to_hold(&g1, "the reload changed the fleet added=b removed=").await,
        "{}",
        g1.log_text()
    );

    write_atomically(
        &hup,
        &gateway_toml(&[("a", &wa.url), ("c", &wc.url)], fleet_hup),
    );
    // The SIGHUP handler is installed just after the listener starts; give it a moment.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let status = std::process::Command::new("kill")
        .arg("-HUP")
        .arg(g2.process.id().to_string())
        .status()
        .expect("run kill");
    assert!(status.success());
    let base2 = g2.base.as_str();
    assert!(
        eventually(150, Duration::from_millis(100), || async move {
            ready_models(c, base2)
                .await
                .contains(&"accumulate".to_string())
        })
        .await,
        "SIGHUP did not reload the config; log:\n{}",
        g2.log_text()
    );
    let r = accumulate(&client, &g2.base, 9, true, true, 5).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.backend.as_deref(), Some("c"));
    assert!(
        eventually(50, Duration::from_millis(100), || async {
            g2.log_text().contains("trigger=\"SIGHUP\"")
        })
        .await,
        "log:\n{}",
        g2.log_text()
    );

    // The watched file caught half-written (truncated, its new text not yet in): the reload
    // is refused, and every model goes on serving.
    std::fs::write(&watched, "").unwrap();
    assert!(
        log_comes_to_hold(
            &g1,
            "the new config has no backends (a file caught half-written?); a reload never empties a serving fleet (restart to do that)"
        )
        .await,
        "log:\n{}",
        g1.log_text()
    );
    assert_eq!(
        ready_models(&client, &g1.base).await,
        vec!["classifier", "simple"]
    );

    // A file with a mistake: the refusal in the log names the file and the line, as
    // `check-config` does (`file:line: message`).
    let broken = gateway_toml(&[("a", &wa.url)], fleet)
        + "[[backends]]\nname = \"z\"\nurl = \"http://127.0.0.1:1\"\nweight = 0\n";
    let line = broken.lines().position(|l| l == "weight = 0").unwrap() + 1;
    write_atomically(&watched, &broken);
    let expected = format!(
        "{}:{line}: backend 'z': weight must be at least 1",
        watched.display()
    );
    assert!(
        log_comes_to_hold(&g1, &expected).await,
        "{expected} not in the log:\n{}",
        g1.log_text()
    );
    assert_eq!(
        ready_models(&client, &g1.base).await,
        vec!["classifier", "simple"]
    );
}

/// Whether a gateway process's log comes to hold `text` within 10 s: lines reach it in
/// batches, every 100 ms.
async fn log_comes_to_hold(g: &GatewayProcess, text: &str) -> bool {
    eventually(100, Duration::from_millis(100), || async {
        g.log_text().contains(text)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_is_not_undone_by_a_dns_rediscovery_running_meanwhile() {
    let pooled = Worker::start("pooled", "127.0.0.2", 0, &["simple"]).await;
    let fixed = Worker::start("fixed", "127.0.0.1", 0, &["simple"]).await;
    // Accepts connections (the kernel does) and never answers: probing it takes the whole
    // probe timeout, so the reload's refresh lasts that long.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_url = format!("http://{}", silent.local_addr().unwrap());
    let resolver = MutableResolver::default();
    resolver.set("workers.test", &["127.0.0.2"]);
    let fleet = "refresh_interval_ms = 200\ndns_interval_ms = 100\nprobe_timeout_ms = 1000";
    let dns = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n\n[fleet]\n{fleet}\n\n\
         [[backends]]\nname = \"pool\"\nurl = \"http://workers.test:{}\"\ndiscovery = \"dns\"\n",
        pooled.port
    );
    let gw = tensorgate::run::start_with_resolver(parse_config(&dns), false, Arc::new(resolver))
        .await
        .expect("the gateway starts");
    let pool_name = format!("pool/127.0.0.2:{}", pooled.port);
    assert_eq!(backend_names(&gw), [pool_name.clone()].into());

    // Replace the DNS backend with two static ones.
    let static_only = gateway_toml(&[("fixed", &fixed.url), ("silent", &silent_url)], fleet);
    gw.reload(parse_config(&static_only))
        .await
        .expect("the reload applies");
    let want: BTreeSet<String> = ["fixed".to_string(), "silent".to_string()].into();
    assert_eq!(backend_names(&gw), want, "the reload was undone");
    // Still so after a few DNS intervals and refreshes; traffic goes to the new backend.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(backend_names(&gw), want, "the reload was undone");
    let client = http_client();
    for x in 0..10 {
        let r = infer_simple(&client, &base(&gw), x).await;
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.backend.as_deref(), Some("fixed"));
    }
    drop(client);
    drop(silent);
    gw.shutdown().await;
}

/// One request of the background load in the reload test.
#[derive(Debug)]
struct Served {
    /// When it started, among all the load's requests.
    order: usize,
    status: u16,
    backend: Option<String>,
    /// Status 200 with the right sum.
    ok: bool,
}

/// `config reloaded` lines a SIGHUP caused in a gateway's log.
fn sighup_reloads(g: &GatewayProcess) -> usize {
    g.log_text()
        .lines()
        .filter(|l| l.contains("config reloaded") && l.contains("SIGHUP"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sighup_reloads_under_load_fail_no_request() {
    let wa = Worker::start("a", "127.0.0.1", 0, &["simple"]).await;
    let wb = Worker::start("b", "127.0.0.1", 0, &["simple"]).await;
    let wc = Worker::start("c", "127.0.0.1", 0, &["simple"]).await;
    let dir = TempDir::new("reload-load");
    let path = dir.path("gateway.toml");
    let fleet = "refresh_interval_ms = 200\nwatch_config = false";
    let config = |backends: &[&Worker]| {
        let pairs: Vec<(&str, &str)> = backends
            .iter()
            .map(|w| (w.name.as_str(), w.url.as_str()))
            .collect();
        gateway_toml(&pairs, fleet)
    };
    write_atomically(&path, &config(&[&wa, &wb]));
    let g = GatewayProcess::start(&path, dir.path("gateway.log")).await;

    // Six clients, each on its keep-alive connection, send `simple` requests back to back
    // (at most 600 each) until told to stop, so that requests are always in flight.
    let started = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let served: Arc<Mutex<Vec<Served>>> = Arc::default();
    let mut tasks = Vec::new();
    for t in 0..6i32 {
        let (base, started, stop, served) = (
            g.base.clone(),
            started.clone(),
            stop.clone(),
            served.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let client = http_client();
            for i in 0..600 {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let order = started.fetch_add(1, Ordering::SeqCst);
                let x = t * 1000 + i;
                let r = infer_simple(&client, &base, x).await;
                let ok = r.status == 200 && r.output_int("OUTPUT0") == Some(x as i64 + 1);
                served.lock().unwrap().push(Served {
                    order,
                    status: r.status,
                    backend: r.backend,
                    ok,
                });
            }
        }));
    }
    let wait_for = |what: &'static str, pred: Box<dyn Fn(&Served) -> bool>, n: usize| {
        let served = served.clone();
        async move {
            let reached = eventually(300, Duration::from_millis(50), || {
                let n_now = served.lock().unwrap().iter().filter(|s| pred(s)).count();
                async move { n_now >= n }
            })
            .await;
            assert!(reached, "the load never got {n} responses {what}");
        }
    };
    wait_for("before the reloads", Box::new(|_| true), 60).await;

    // Reload 1 adds worker c, which then takes part of the load.
    write_atomically(&path, &config(&[&wa, &wb, &wc]));
    g.sighup();
    assert!(
        eventually(150, Duration::from_millis(100), || async {
            sighup_reloads(&g) >= 1
        })
        .await,
        "the first SIGHUP did not reload; log:\n{}",
        g.log_text()
    );
    wait_for(
        "from the added worker",
        Box::new(|s| s.backend.as_deref() == Some("c")),
        20,
    )
    .await;

    // Reload 2 removes worker a while requests to it may be in flight.
    write_atomically(&path, &config(&[&wb, &wc]));
    g.sighup();
    assert!(
        eventually(150, Duration::from_millis(100), || async {
            sighup_reloads(&g) >= 2
        })
        .await,
        "the second SIGHUP did not reload; log:\n{}",
        g.log_text()
    );
    let mark = started.load(Ordering::SeqCst);
    wait_for(
        "after the second reload",
        Box::new(move |s| s.order >= mark),
        60,
    )
    .await;
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.expect("a load task failed");
    }

    let served = served.lock().unwrap();
    let failed: Vec<&Served> = served.iter().filter(|s| !s.ok).collect();
    assert!(
        failed.is_empty(),
        "{} of {} requests failed during the reloads: {:?}",
        failed.len(),
        served.len(),
        &failed[..failed.len().min(5)]
    );
    assert!(served.iter().all(|s| s.status == 200));
    assert!(served.iter().any(|s| s.backend.as_deref() == Some("a")));
    let late_on_a = served
        .iter()
        .filter(|s| s.order >= mark && s.backend.as_deref() == Some("a"))
        .count();
    assert_eq!(
        late_on_a, 0,
        "requests started after the removal reached it"
    );
}

/// A DNS backend whose name resolves to no address (a headless Service before its first
/// ready pod) is a backend down, not an empty config: readiness names it and why, a model
/// is a 503 that names it (not a 404), and its health series is there at 0 to alert on.
/// Once the name resolves, it serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dns_backend_without_addresses_is_named_as_down() {
    let worker = Worker::start("w", "127.0.0.1", 0, &["simple"]).await;
    let resolver = MutableResolver::default();
    let gw = start_dns_gateway(
        "refresh_interval_ms = 200\ndns_interval_ms = 200",
        worker.port,
        Arc::new(resolver.clone()),
    )
    .await;
    let b = base(&gw);
    let client = http_client();
    let error_of = |path: &'static str| {
        let (client, b) = (client.clone(), b.clone());
        async move {
            let r = client.get(format!("{b}{path}")).send().await.unwrap();
            let status = r.status().as_u16();
            let body: serde_json::Value = r.json().await.unwrap();
            (
                status,
                body["error"].as_str().unwrap_or_default().to_string(),
            )
        }
    };
    let why = "DNS discovery failed: cannot resolve 'workers.test'";
    assert_eq!(
        error_of("/v2/health/ready").await,
        (
            503,
            format!("no backend has a ready model; backend 'pool' has no address: {why}")
        )
    );
    assert_eq!(
        error_of("/v2/models/simple/ready").await,
        (
            503,
            format!("unknown model 'simple', but backend 'pool' ({why}) has not been reached to say which models it serves; retry later")
        )
    );
    let metrics = |gw: &Running| {
        gw.gateway.update_gauges();
        String::from_utf8(gw.gateway.metrics.render()).unwrap()
    };
    let before = metrics(&gw);
    assert!(
        before.contains(r#"tensorgate_backend_healthy{backend="pool"} 0"#),
        "{before}"
    );

    resolver.set("workers.test", &["127.0.0.1"]);
    let url = format!("{b}/v2/models/simple/ready");
    let c = &client;
    assert!(
        eventually(100, Duration::from_millis(100), || {
            let url = url.clone();
            async move { c.get(url).send().await.is_ok_and(|r| r.status() == 200) }
        })
        .await,
        "the name resolved, but the model never became ready"
    );
    let after = metrics(&gw);
    assert!(!after.contains(r#"backend="pool"}"#), "{after}");

    // The name resolves, but to no address (every pod gone): the same, in its own words.
    resolver.set("workers.test", &[]);
    let ready = format!("{b}/v2/health/ready");
    let gone = format!(
        "no backend has a ready model; backend 'pool' has no address: DNS discovery of http://workers.test:{} found no address",
        worker.port
    );
    assert!(
        eventually(100, Duration::from_millis(100), || {
            let (ready, gone) = (ready.clone(), gone.clone());
            async move {
                let Ok(r) = c.get(ready).send().await else {
                    return false;
                };
                let body: serde_json::Value = r.json().await.unwrap_or_default();
                body["error"] == gone.as_str()
            }
        })
        .await,
        "readiness never said: {gone}"
    );
    gw.shutdown().await;
}
