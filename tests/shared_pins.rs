//! Shared pins through a real `redis-server` (`[fleet.pins] store = "redis"`): replicas that
//! disagree about the fleet, a replica restarted with live sequences, Redis killed under load
//! or silent, and the keys' lifetime. scripts/test.sh installs Debian's redis-server.

use crate::common_fleet;
use crate::common_grpc;
use crate::pki;

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common_fleet::*;
use common_grpc::{accumulate_grpc, connect, int64};
use tensorgate::pinstore::Claimed;
use tensorgate::protocol::SequenceId;
use tensorgate::run::Running;

const PREFIX: &str = "tensorgate:pin:";

/// A `redis-server` on a loopback port, killed on drop. Nothing is persisted: pins are
/// soft state.
struct Redis {
    port: u16,
    /// What clients connect with: `redis://` or `rediss://`, with the password if any.
    url: String,
    /// The CA of a TLS listener's certificate.
    ca: Option<std::path::PathBuf>,
    process: ChildGuard,
    _dir: TempDir,
}

impl Redis {
    async fn start() -> Redis {
        Redis::start_on(free_port("127.0.0.1")).await
    }

    async fn start_on(port: u16) -> Redis {
        let url = format!("redis://127.0.0.1:{port}/0");
        Redis::launch(port, url, None, &["--port", &port.to_string()]).await
    }

    /// TLS only, with a password: the server's certificate from `pki`.
    async fn start_secure(pki: &pki::Pki, password: &str) -> Redis {
        let port = free_port("127.0.0.1");
        let (cert, key) = pki.issue("redis", &["127.0.0.1"], false);
        let url = format!("rediss://:{password}@127.0.0.1:{port}/0");
        let (cert, key, ca) = (
            cert.display().to_string(),
            key.display().to_string(),
            pki.ca().display().to_string(),
        );
        let args = [
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--tls-cert-file",
            &cert,
            "--tls-key-file",
            &key,
            "--tls-ca-cert-file",
            &ca,
            "--tls-auth-clients",
            "no",
            "--requirepass",
            password,
        ];
        Redis::launch(port, url, Some(pki.ca()), &args).await
    }

    async fn launch(
        port: u16,
        url: String,
        ca: Option<std::path::PathBuf>,
        args: &[&str],
    ) -> Redis {
        let dir = TempDir::new("redis");
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(args)
            .arg("--dir")
            .arg(&dir.0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is installed (scripts/test.sh installs it)");
        let redis = Redis {
            port,
            url,
            ca,
            process: ChildGuard { child },
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let pong: Result<String, _> = redis
                .client()
                .get_connection()
                .and_then(|mut c| redis::cmd("PING").query(&mut c));
            if pong.as_deref() == Ok("PONG") {
                return redis;
            }
            assert!(
                Instant::now() < deadline,
                "redis-server did not start: {pong:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn url(&self) -> String {
        self.url.clone()
    }

    /// A Redis with a user `pins` that has the pin keys and every command, but no channel
    /// (what Redis 7 gives a new ACL user), and the URL that logs in as it.
    async fn with_user_without_channels() -> (Redis, String) {
        let redis = Redis::start().await;
        let mut c = redis.client().get_connection().unwrap();
        let () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg("pins")
            .arg("on")
            .arg(">pw")
            .arg("~tensorgate:pin:*")
            .arg("+@all")
            .arg("resetchannels")
            .query(&mut c)
            .unwrap();
        let url = format!("redis://pins:pw@127.0.0.1:{}/0", redis.port);
        (redis, url)
    }

    fn client(&self) -> redis::Client {
        match &self.ca {
            Some(ca) => redis::Client::build_with_tls(
                self.url.as_str(),
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(std::fs::read(ca).unwrap()),
                },
            )
            .unwrap(),
            None => redis::Client::open(self.url.as_str()).unwrap(),
        }
    }

    fn get(&self, key: &str) -> Option<String> {
        let mut c = self.client().get_connection().unwrap();
        redis::cmd("GET").arg(key).query(&mut c).unwrap()
    }

    /// Milliseconds the key has left: -2 when it does not exist.
    fn pttl(&self, key: &str) -> i64 {
        let mut c = self.client().get_connection().unwrap();
        redis::cmd("PTTL").arg(key).query(&mut c).unwrap()
    }

    /// Stores `value` for `key` behind the gateways' backs (no announcement), for a minute.
    fn set(&self, key: &str, value: &str) {
        let mut c = self.client().get_connection().unwrap();
        let () = redis::cmd("SET")
            .arg(key)
            .arg(value)
            .arg("PX")
            .arg(60_000)
            .query(&mut c)
            .unwrap();
    }

    fn keys(&self) -> Vec<String> {
        let mut c = self.client().get_connection().unwrap();
        redis::cmd("KEYS").arg("*").query(&mut c).unwrap()
    }
}

/// The `[fleet]` keys that share pins through `url`, with a generous store timeout: on a
/// loaded CI machine a round trip can pass the 50 ms default, and a test that counts no
/// store errors would fail.
fn pins_toml(fleet: &str, url: &str) -> String {
    pins_toml_with(fleet, url, "timeout_ms = 2000\n")
}

/// The same with `store` keys of its own (a timeout to hit, a key prefix).
fn pins_toml_with(fleet: &str, url: &str, store: &str) -> String {
    format!("{fleet}\n\n[fleet.pins]\nstore = \"redis\"\nurl = \"{url}\"\n{store}")
}

fn store_errors(gw: &Running) -> u64 {
    let m = &gw.gateway.metrics;
    ["claim", "put", "remove", "refresh"]
        .iter()
        .map(|op| m.pin_store_errors.with_label_values(&[op]).get())
        .sum()
}

/// What a join seen by one replica at a time did to sequences.
struct JoinReport {
    /// Sequences that started on the new worker through a replica that saw it, before the
    /// others had been told of it.
    started_on_new_in_window: usize,
    /// Whether the last replica knew the new worker before it was told to look again: a
    /// shared pin made it look.
    caught_up_on_demand: bool,
}

/// Four workers behind one DNS name, three replicas that resolve it again only when told
/// to (or when a shared pin names an address they do not know). The name gains a fourth
/// address, and the replicas learn it one at a time; meanwhile sequences start on each
/// replica in turn and continue through random replicas.
async fn join_one_replica_at_a_time(pins: Option<&Redis>) -> Result<JoinReport, String> {
    let ips = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"];
    let port = free_port_on_all(&ips);
    let mut workers = Vec::new();
    for ip in ips {
        workers.push(Worker::start(ip, ip, port, &["accumulate"]).await);
    }
    let resolver = MutableResolver::default();
    resolver.set("workers.test", &ips[..3]);
    let mut fleet = String::from("refresh_interval_ms = 200\ndns_interval_ms = 3600000");
    if let Some(redis) = pins {
        fleet = pins_toml(&fleet, &redis.url());
    }
    let mut gateways = Vec::new();
    for _ in 0..3 {
        gateways.push(start_dns_gateway(&fleet, port, Arc::new(resolver.clone())).await);
    }
    let bases: Vec<String> = gateways.iter().map(base).collect();
    let new_worker = format!("pool/{}:{port}", ips[3]);
    let client = http_client();
    let mut rng = fastrand::Rng::with_seed(0x5eed_0201);

    // Before the join: 30 sequences, two requests each, anywhere.
    let seqs: Vec<Seq> = (1..=30).map(|id| Seq::new(id, 12, &mut rng)).collect();
    let mut live = drive(seqs, &bases, 3, 0x5eed_0202, 2).await?;

    resolver.set("workers.test", &ips);
    let mut report = JoinReport {
        started_on_new_in_window: 0,
        caught_up_on_demand: false,
    };
    for (k, gw) in gateways.iter().enumerate() {
        if k == 2 {
            report.caught_up_on_demand = ready_names(gw).contains(&new_worker);
        }
        gw.gateway.rediscover().await?;
        assert!(
            ready_names(gw).contains(&new_worker),
            "replica {k} sees the new worker"
        );
        // 30 sequences start on replica k, which sees the new worker while replicas after
        // it do not (unless a shared pin made them look); then every live sequence moves on.
        for id in 0..30 {
            let mut s = Seq::new(1000 * (k as u64 + 1) + id, 12, &mut rng);
            s.step(&client, &bases[k]).await?;
            if k < 2 && s.backend.as_deref() == Some(new_worker.as_str()) {
                report.started_on_new_in_window += 1;
            }
            live.push(s);
        }
        live = drive(live, &bases, 3, 0x5eed_0203 + k as u64, 2 * k + 4).await?;
    }
    let done = drive(live, &bases, 3, 0x5eed_0210, usize::MAX).await?;
    assert!(done.iter().all(Seq::done));
    for gw in gateways {
        gw.shutdown().await;
    }
    Ok(report)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sequences_that_start_while_replicas_disagree_all_succeed() {
    let redis = Redis::start().await;
    let report = join_one_replica_at_a_time(Some(&redis))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        report.started_on_new_in_window >= 3,
        "only {} sequences started on the new worker before every replica knew it",
        report.started_on_new_in_window
    );
    assert!(
        report.caught_up_on_demand,
        "the last replica learnt of the new worker only when told"
    );
    assert!(
        redis.keys().is_empty(),
        "every sequence ended, yet pins are left: {:?}",
        redis.keys()
    );
}

/// The same join without the store fails: the scenario above is worth something.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_the_store_the_same_join_loses_sequences() {
    let failure = join_one_replica_at_a_time(None).await.err().expect(
        "a sequence that started on the new worker fails on a replica that does not know it",
    );
    assert!(failure.contains("status 400"), "{failure}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restarted_replica_continues_live_sequences_over_either_transport() {
    let redis = Redis::start().await;
    let workers = Worker::start_many(4, &["accumulate"]).await;
    let first3: Vec<&Worker> = workers[..3].iter().collect();
    let all4: Vec<&Worker> = workers.iter().collect();
    let fleet = pins_toml("refresh_interval_ms = 200", &redis.url());
    let with_grpc = |mut config: tensorgate::config::Config| {
        config.server.grpc_listen = Some("127.0.0.1:0".parse().unwrap());
        config
    };
    let r0 = start_gateway(with_grpc(gateway_config(&first3, &fleet))).await;
    let r1 = start_gateway(gateway_config(&first3, &fleet)).await;
    let bases = [base(&r0), base(&r1)];

    // Sequences 1 to 40 start over REST on either replica; 41 to 80 over gRPC on r0 (about a
    // quarter of them move when the fourth worker joins: enough that at least 5 do).
    let mut rng = fastrand::Rng::with_seed(0x5eed_0301);
    let rest: Vec<Seq> = (1..=40).map(|id| Seq::new(id, 6, &mut rng)).collect();
    let mut live = drive(rest, &bases, 2, 0x5eed_0302, 2)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut grpc = connect(r0.grpc_addr.unwrap()).await;
    for id in 41..=80u64 {
        let mut s = Seq::new(id, 6, &mut rng);
        let (sum, backend) = accumulate_grpc(&mut grpc, int64(id as i64), s.values[0], true)
            .await
            .unwrap_or_else(|e| panic!("sequence {id} over gRPC: {e}"));
        assert_eq!(sum, s.values[0]);
        s.sum = sum;
        s.next = 1;
        s.backend = Some(backend.clone());
        s.served_by.push(backend);
        s.via.push("grpc r0".into());
        live.push(s);
    }

    // r1 goes away; a fourth worker joins; r1 comes back knowing all four, with no pins and
    // no memory of the old table.
    r1.shutdown().await;
    r0.reload(gateway_config(&all4, &fleet)).await.unwrap();
    let r1 = start_gateway(with_grpc(gateway_config(&all4, &fleet))).await;
    moved_by_the_change(&r1, &live);

    // Sequences 1 to 40 take one step over gRPC on the restarted replica; all of them then
    // finish over REST there.
    let mut grpc = connect(r1.grpc_addr.unwrap()).await;
    for s in live.iter_mut().filter(|s| s.id <= 40) {
        let v = s.values[s.next];
        let (sum, backend) = accumulate_grpc(&mut grpc, int64(s.id as i64), v, false)
            .await
            .unwrap_or_else(|e| panic!("sequence {} over gRPC on r1: {e}", s.id));
        assert_eq!(
            (sum, Some(backend)),
            (s.sum.wrapping_add(v), s.backend.clone()),
            "sequence {}",
            s.id
        );
        s.sum = sum;
        s.next += 1;
    }
    let done = drive(live, &[base(&r1)], 2, 0x5eed_0303, usize::MAX)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(done.iter().all(Seq::done));
    assert_eq!(
        redis.keys(),
        Vec::<String>::new(),
        "sequence_end removes pins"
    );
    assert_eq!(store_errors(&r1), 0);
    r0.shutdown().await;
    r1.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_killed_under_load_fails_no_request() {
    let mut redis = Redis::start().await;
    let port = redis.port;
    let workers = Worker::start_many(3, &["accumulate", "simple"]).await;
    let all: Vec<&Worker> = workers.iter().collect();
    let fleet = pins_toml("refresh_interval_ms = 200", &redis.url());
    let r0 = start_gateway(gateway_config(&all, &fleet)).await;
    let r1 = start_gateway(gateway_config(&all, &fleet)).await;
    let bases = Arc::new([base(&r0), base(&r1)]);

    // Four clients run six-request sequences through random replicas, each followed by a
    // stateless request, until told to stop (and at most 400 sequences each).
    let sent = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for t in 0..4u64 {
        let (bases, sent, stop) = (bases.clone(), sent.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let client = http_client();
            let mut rng = fastrand::Rng::with_seed(0x5eed_0400 + t);
            for n in 0..400u64 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let mut s = Seq::new(t * 10_000 + n + 1, 6, &mut rng);
                while !s.done() {
                    s.step(&client, &bases[rng.usize(..2)]).await?;
                    sent.fetch_add(1, Ordering::Relaxed);
                }
                let r = infer_simple(&client, &bases[rng.usize(..2)], n as i32).await;
                if r.status != 200 {
                    return Err(format!("simple: {r:?}"));
                }
                sent.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<(), String>(())
        }));
    }
    let wait_for = |count: usize| {
        let sent = sent.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(30);
            while sent.load(Ordering::Relaxed) < count && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert!(sent.load(Ordering::Relaxed) >= count, "the load stalled");
        }
    };
    wait_for(200).await;
    redis.process.kill();
    let at_kill = sent.load(Ordering::Relaxed);
    wait_for(at_kill + 400).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap().unwrap_or_else(|e| panic!("{e}"));
    }
    let errors = store_errors(&r0) + store_errors(&r1);
    assert!(errors > 0, "the store's failures are counted");
    assert_eq!(r0.gateway.metrics.pin_store_up.get(), 0);
    assert_eq!(r1.gateway.metrics.pin_store_up.get(), 0);

    // Redis comes back on its port: the store says it is up again without any sequence
    // request (r1 gets none from here on: an alert on the gauge clears on an idle fleet),
    // and new sequences are stored again.
    let redis = Redis::start_on(port).await;
    assert!(
        eventually(50, Duration::from_millis(100), || std::future::ready(
            r1.gateway.metrics.pin_store_up.get() == 1
        ))
        .await,
        "the idle replica never saw the store come back"
    );
    let client = http_client();
    let mut stored = false;
    for id in 900_000..900_050u64 {
        let r = accumulate(&client, &bases[0], id, true, false, 1).await;
        assert_eq!(r.status, 200, "{r:?}");
        if redis.get(&format!("{PREFIX}accumulate:u:{id}")).is_some() {
            stored = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(stored, "no new sequence was stored after Redis came back");
    assert_eq!(r0.gateway.metrics.pin_store_up.get(), 1);
    let text = String::from_utf8(r0.gateway.metrics.render()).unwrap();
    assert!(text.contains("\ntensorgate_pin_store_up 1\n"), "{text}");
    r0.shutdown().await;
    r1.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pins_expire_after_the_idle_timeout_and_end_with_the_sequence() {
    let redis = Redis::start().await;
    let workers = Worker::start_many(2, &["accumulate"]).await;
    let all: Vec<&Worker> = workers.iter().collect();
    let fleet = pins_toml_with(
        "refresh_interval_ms = 200\nsequence_idle_timeout_ms = 1000",
        &redis.url(),
        "key_prefix = \"edge:\"\ntimeout_ms = 2000\n",
    );
    let gw = start_gateway(gateway_config(&all, &fleet)).await;
    let b = base(&gw);
    let client = http_client();
    let url_of = |name: &str| workers.iter().find(|w| w.name == name).unwrap().url.clone();

    // A start stores the backend's URL with the idle timeout; the end deletes it.
    let r = accumulate(&client, &b, 1, true, false, 3).await;
    assert_eq!(r.status, 200, "{r:?}");
    let key = "edge:accumulate:u:1";
    assert_eq!(redis.get(key), Some(url_of(r.backend.as_deref().unwrap())));
    let ttl = redis.pttl(key);
    assert!((1..=1000).contains(&ttl), "TTL {ttl} ms");
    let r = accumulate(&client, &b, 1, false, true, 4).await;
    assert_eq!((r.status, r.output_int("OUTPUT0")), (200, Some(7)));
    assert_eq!(redis.get(key), None);
    assert!(gw
        .gateway
        .router
        .pins
        .get("accumulate", &SequenceId::Uint(1))
        .is_none());

    // A string id, then silence: Redis lets the pin go after the idle timeout.
    let body = serde_json::json!({
        "parameters": {"sequence_id": "a:b", "sequence_start": true},
        "inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1], "data": [1]}],
    });
    let r = post_infer(&client, &b, "accumulate", &body).await;
    assert_eq!(r.status, 200, "{r:?}");
    let key = "edge:accumulate:s:a:b";
    assert_eq!(redis.get(key), Some(url_of(r.backend.as_deref().unwrap())));
    let gone = eventually(40, Duration::from_millis(100), || async {
        redis.pttl(key) == -2
    })
    .await;
    assert!(gone, "the pin outlived the idle timeout");
    assert_eq!(store_errors(&gw), 0);
    gw.shutdown().await;
}

/// A sequence request that no backend takes leaves no key that its own claim created (a
/// client sending ids nothing accepts must not fill Redis for an idle timeout); a sequence
/// another replica stored on a backend that no longer knows it is lost, and its key goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_sequence_request_leaves_no_key() {
    let redis = Redis::start().await;
    let workers = Worker::start_many(2, &["accumulate"]).await;
    let all: Vec<&Worker> = workers.iter().collect();
    let gw = start_gateway(gateway_config(&all, &pins_toml("", &redis.url()))).await;
    let b = base(&gw);
    let client = http_client();
    let refusal = |id: u64| {
        format!(
            "inference request for sequence {id} to model 'accumulate' must specify the START flag on the first request of the sequence"
        )
    };

    for id in [41, 42, 43] {
        let r = accumulate(&client, &b, id, false, false, 1).await;
        assert_eq!((r.status, r.error()), (400, Some(refusal(id).as_str())));
    }
    assert_eq!(redis.keys(), Vec::<String>::new());
    assert!(gw.gateway.router.pins.is_empty());

    // Another replica stored the sequence on a backend that does not know it (it restarted):
    // the state is lost, which is no fault of the client's (503), and the key goes.
    let key = format!("{PREFIX}accumulate:u:44");
    redis.set(&key, &workers[0].url);
    let r = accumulate(&client, &b, 44, false, false, 1).await;
    assert_eq!(
        (r.status, r.error()),
        (
            503,
            Some(format!("the backend of sequence 44 of model 'accumulate' ({}) no longer knows the sequence (it restarted, or the sequence was idle past its timeout); the sequence's state is lost", workers[0].url).as_str())
        )
    );
    assert_eq!(redis.get(&key), None);

    // A start is stored.
    let r = accumulate(&client, &b, 45, true, false, 1).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert!(redis.get(&format!("{PREFIX}accumulate:u:45")).is_some());
    assert_eq!(store_errors(&gw), 0);
    gw.shutdown().await;
}

/// A live sequence whose backend is gone (its connection refused, before a health check saw
/// it): the state is lost (503), and the pin goes from the store too, so that no replica
/// sends the id there again; a new start of the id is stored where it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sequence_whose_backend_is_gone_leaves_the_store() {
    let redis = Redis::start().await;
    let mut workers = Worker::start_many(2, &["accumulate"]).await;
    let all: Vec<&Worker> = workers.iter().collect();
    let fleet = pins_toml("refresh_interval_ms = 60000", &redis.url());
    let gw = start_gateway(gateway_config(&all, &fleet)).await;
    let b = base(&gw);
    let client = http_client();
    let r = accumulate(&client, &b, 46, true, false, 1).await;
    assert_eq!(r.status, 200, "{r:?}");
    let served = r.backend.clone().unwrap();
    let key = format!("{PREFIX}accumulate:u:46");
    let gone = workers.iter_mut().find(|w| w.name == served).unwrap();
    let gone_url = gone.url.clone();
    assert_eq!(redis.get(&key), Some(gone_url.clone()));
    gone.process.kill();

    let r = accumulate(&client, &b, 46, false, false, 1).await;
    assert_eq!(
        (r.status, r.error()),
        (
            503,
            Some(format!("the backend of sequence 46 of model 'accumulate' ({gone_url}) is unavailable; the sequence's state is lost").as_str())
        )
    );
    assert_eq!(
        redis.get(&key),
        None,
        "the lost sequence's pin stayed in the store"
    );
    assert!(gw
        .gateway
        .router
        .pins
        .get("accumulate", &SequenceId::Uint(46))
        .is_none());
    let r = accumulate(&client, &b, 46, true, false, 5).await;
    assert_eq!(r.status, 200, "{r:?}");
    let now = workers
        .iter()
        .find(|w| Some(&w.name) == r.backend.as_ref())
        .unwrap();
    assert_eq!(redis.get(&key), Some(now.url.clone()));
    assert_eq!(store_errors(&gw), 0);
    gw.shutdown().await;
}

/// A Redis that accepts connections and never answers: every operation times out, and
/// every request is still served, by the hash table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_redis_costs_no_request() {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("redis://{}/0", silent.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            open.push(socket);
        }
    });
    let workers = Worker::start_many(2, &["accumulate"]).await;
    let all: Vec<&Worker> = workers.iter().collect();
    let fleet = pins_toml_with("refresh_interval_ms = 200", &url, "timeout_ms = 30\n");
    let gw = start_gateway(gateway_config(&all, &fleet)).await;
    let mut rng = fastrand::Rng::with_seed(0x5eed_0501);
    let seqs: Vec<Seq> = (1..=20).map(|id| Seq::new(id, 4, &mut rng)).collect();
    let done = drive(seqs, &[base(&gw)], 2, 0x5eed_0502, usize::MAX)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(done.iter().all(Seq::done));
    assert!(store_errors(&gw) > 0);
    assert_eq!(gw.gateway.metrics.pin_store_up.get(), 0);
    gw.shutdown().await;
    held.abort();
}

/// `rediss://` with a private CA (`ca`) and a password in the URL; a wrong password is a
/// store failure like any other, not a failed request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_and_a_password_reach_redis() {
    let pki = pki::Pki::new("redis-pins");
    let redis = Redis::start_secure(&pki, "s3cret").await;
    let workers = Worker::start_many(2, &["accumulate"]).await;
    let all: Vec<&Worker> = workers.iter().collect();
    let secure = |url: &str| {
        format!(
            "{}ca = {:?}\n",
            pins_toml("refresh_interval_ms = 200", url),
            pki.ca().display().to_string()
        )
    };
    let gw = start_gateway(gateway_config(&all, &secure(&redis.url()))).await;
    let client = http_client();
    let r = accumulate(&client, &base(&gw), 77, true, false, 1).await;
    assert_eq!(r.status, 200, "{r:?}");
    let stored = redis.get(&format!("{PREFIX}accumulate:u:77"));
    let served = workers.iter().find(|w| Some(&w.name) == r.backend.as_ref());
    assert_eq!(stored, served.map(|w| w.url.clone()));
    assert_eq!(store_errors(&gw), 0);

    let wrong = redis.url().replace("s3cret", "wrong");
    let gw2 = start_gateway(gateway_config(&all, &secure(&wrong))).await;
    let r = accumulate(&client, &base(&gw2), 78, true, false, 1).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert!(store_errors(&gw2) > 0);
    assert_eq!(redis.get(&format!("{PREFIX}accumulate:u:78")), None);
    gw.shutdown().await;
    gw2.shutdown().await;

    // A gateway process says at startup why Redis refuses it: within the operations'
    // 50 ms a refused AUTH would read as "no answer".
    let dir = TempDir::new("wrong-password");
    let pairs: Vec<(&str, &str)> = workers
        .iter()
        .map(|w| (w.name.as_str(), w.url.as_str()))
        .collect();
    let config = dir.0.join("gateway.toml");
    std::fs::write(&config, gateway_toml(&pairs, &secure(&wrong))).unwrap();
    let gw3 = GatewayProcess::start(&config, dir.0.join("gateway.log")).await;
    let mut log = String::new();
    for _ in 0..100 {
        log = gw3.log_text();
        if log.contains("the pin store cannot be used") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let refusal = log
        .lines()
        .find(|l| l.contains("the pin store cannot be used"))
        .unwrap_or_else(|| panic!("no refusal logged:\n{log}"));
    assert!(
        refusal.contains("error=Password authentication failed"),
        "{refusal}"
    );
    assert!(
        !refusal.contains("wrong@"),
        "the password is shown: {refusal}"
    );
}

/// A Redis user that may not PUBLISH on the changes channel (Redis 7 gives new ACL users no
/// channels) still stores and removes pins: the writes are not undone, and a refused
/// announcement is not a store outage (it had made every end back off the store for a
/// second, routing the requests of that second without it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_the_changes_channel_still_shares_pins() {
    let (redis, url) = Redis::with_user_without_channels().await;
    let workers = Worker::start_many(2, &["accumulate"]).await;
    let all: Vec<&Worker> = workers.iter().collect();
    let gw = start_gateway(gateway_config(&all, &pins_toml("", &url))).await;
    let b = base(&gw);
    let client = http_client();
    let key = format!("{PREFIX}accumulate:u:95");
    for round in 0..3 {
        let r = accumulate(&client, &b, 95, true, false, 1).await;
        assert_eq!(r.status, 200, "round {round}: {r:?}");
        assert!(redis.get(&key).is_some(), "round {round}: not stored");
        let r = accumulate(&client, &b, 95, false, true, 2).await;
        assert_eq!(
            (r.status, r.output_int("OUTPUT0")),
            (200, Some(3)),
            "round {round}: {r:?}"
        );
        assert_eq!(redis.get(&key), None, "round {round}: the end left the pin");
    }
    assert_eq!(store_errors(&gw), 0);
    assert_eq!(gw.gateway.metrics.pin_store_up.get(), 1);
    gw.shutdown().await;
}

/// The same user, seen in a gateway process's log: the refused subscription says which
/// channel the ACL lacks, and the refused announcements are said once, not per write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_the_changes_channel_is_told_what_to_grant() {
    let (redis, url) = Redis::with_user_without_channels().await;
    let workers = Worker::start_many(2, &["accumulate"]).await;
    let pairs: Vec<(&str, &str)> = workers
        .iter()
        .map(|w| (w.name.as_str(), w.url.as_str()))
        .collect();
    let dir = TempDir::new("no-channel");
    let config = dir.0.join("gateway.toml");
    std::fs::write(&config, gateway_toml(&pairs, &pins_toml("", &url))).unwrap();
    let gw = GatewayProcess::start(&config, dir.0.join("gateway.log")).await;
    let client = http_client();
    // Each end announces its pin's removal: three announcements, all refused.
    let key = format!("{PREFIX}accumulate:u:96");
    for round in 0..3 {
        let r = accumulate(&client, &gw.base, 96, true, false, 1).await;
        assert_eq!(r.status, 200, "round {round}: {r:?}");
        let r = accumulate(&client, &gw.base, 96, false, true, 2).await;
        assert_eq!((r.status, r.output_int("OUTPUT0")), (200, Some(3)), "{r:?}");
        assert_eq!(redis.get(&key), None, "round {round}: the end left the pin");
    }
    let subscription = "cannot subscribe to the pin store's changes channel";
    let announcement = "the pin store refuses to announce moved and removed pins";
    let mut log = String::new();
    for _ in 0..100 {
        log = gw.log_text();
        if log.contains(subscription) && log.contains(announcement) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let line = |what: &str| {
        log.lines()
            .find(|l| l.contains(what))
            .unwrap_or_else(|| panic!("no '{what}' logged:\n{log}"))
            .to_string()
    };
    let subscribed = line(subscription);
    assert!(subscribed.contains("error=\"NoPerm: "), "{subscribed}");
    assert!(
        subscribed.contains("(a Redis ACL user needs the channel tensorgate:pin:changes)"),
        "{subscribed}"
    );
    let announced = line(announcement);
    assert!(
        announced.contains("channel=tensorgate:pin:changes"),
        "{announced}"
    );
    assert_eq!(log.matches(announcement).count(), 1, "{log}");
    assert!(!log.contains("pw@"), "the password is shown:\n{log}");
}

/// A start served while Redis did not answer is written back once it does: it is the newest
/// word on its id, and replicas that cached what the store held before would otherwise keep
/// sending the id's requests to the older sequence's state (a user saw 200s with wrong sums
/// for as long as the sequence lived, after a 0.3 s stall of Redis).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_the_store_missed_is_written_back() {
    let redis = Redis::start().await;
    let workers = Worker::start_many(2, &["accumulate"]).await;
    let all: Vec<&Worker> = workers.iter().collect();
    let fleet = pins_toml_with("", &redis.url(), "timeout_ms = 200\n");
    let gw = start_gateway(gateway_config(&all, &fleet)).await;
    let b = base(&gw);
    let client = http_client();
    // What another replica stored for the id before the stall.
    let key = format!("{PREFIX}accumulate:u:97");
    let elsewhere = "http://127.0.0.1:1";
    redis.set(&key, elsewhere);
    let pid = redis.process.id().to_string();
    let signal = |s: &str| {
        assert!(Command::new("kill")
            .args([s, pid.as_str()])
            .status()
            .unwrap()
            .success())
    };
    signal("-STOP");
    let r = accumulate(&client, &b, 97, true, false, 100).await;
    signal("-CONT");
    assert_eq!(
        (r.status, r.output_int("OUTPUT0")),
        (200, Some(100)),
        "{r:?}"
    );
    assert!(
        store_errors(&gw) > 0,
        "the claim was answered during the stall"
    );
    let served = workers
        .iter()
        .find(|w| Some(&w.name) == r.backend.as_ref())
        .unwrap();
    let written = eventually(50, Duration::from_millis(100), || async {
        redis.get(&key).as_deref() == Some(served.url.as_str())
    })
    .await;
    assert!(written, "the store still holds {:?}", redis.get(&key));
    let r = accumulate(&client, &b, 97, false, false, 1).await;
    assert_eq!(r.output_int("OUTPUT0"), Some(101), "{r:?}");
    gw.shutdown().await;
}

/// When Redis goes down, a request's operation only learns that no answer came within
/// timeout_ms, which reads as a slow Redis; the once-a-second probe then says why (here a
/// refused connection), once for the outage, and the store's return is said too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_is_logged_with_its_cause() {
    let mut redis = Redis::start().await;
    let port = redis.port;
    let workers = Worker::start_many(1, &["accumulate"]).await;
    let pairs: Vec<(&str, &str)> = workers
        .iter()
        .map(|w| (w.name.as_str(), w.url.as_str()))
        .collect();
    let dir = TempDir::new("outage-cause");
    let config = dir.0.join("gateway.toml");
    std::fs::write(&config, gateway_toml(&pairs, &pins_toml("", &redis.url()))).unwrap();
    let gw = GatewayProcess::start(&config, dir.0.join("gateway.log")).await;
    let client = http_client();
    let r = accumulate(&client, &gw.base, 90, true, false, 1).await;
    assert_eq!(r.status, 200, "{r:?}");
    redis.process.kill();
    let r = accumulate(&client, &gw.base, 91, true, false, 1).await;
    assert_eq!(r.status, 200, "{r:?}");
    let cause = "the pin store does not answer a new connection either";
    let logged = eventually(50, Duration::from_millis(100), || async {
        gw.log_text().contains(cause)
    })
    .await;
    let log = gw.log_text();
    assert!(logged, "no cause logged:\n{log}");
    let line = log.lines().find(|l| l.contains(cause)).unwrap();
    assert!(line.contains("Connection refused"), "{line}");
    // Once per outage, however many probes fail.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(gw.log_text().matches(cause).count(), 1);
    // The changes subscription cannot come back either: a refused connection, which is no
    // matter of the Redis user's channels.
    let log = gw.log_text();
    let unsubscribed = log
        .lines()
        .find(|l| l.contains("cannot subscribe to the pin store's changes channel"))
        .unwrap_or_else(|| panic!("no subscription failure logged:\n{log}"));
    assert!(
        unsubscribed.contains("Connection refused") && !unsubscribed.contains("ACL"),
        "{unsubscribed}"
    );
    let back = Redis::start_on(port).await;
    let answers = eventually(50, Duration::from_millis(100), || async {
        gw.log_text().contains("the pin store answers again")
    })
    .await;
    assert!(answers, "no recovery logged:\n{}", gw.log_text());
    // The start served during the outage is written back at once: the connection the
    // operations use is made again before the store counts as back (it held the outage's
    // failed reconnection, and the first writes failed on it for seconds).
    let key = format!("{PREFIX}accumulate:u:91");
    let written = eventually(10, Duration::from_millis(100), || async {
        back.get(&key).as_deref() == Some(workers[0].url.as_str())
    })
    .await;
    let log = gw.log_text();
    assert!(written, "not written back:\n{log}");
    let after = &log[log.find("the pin store answers again").unwrap()..];
    assert!(
        !after.contains("pin store unavailable"),
        "a write failed after the store came back:\n{log}"
    );
}

/// Every request that goes without the store is counted, those in the second after a
/// failure (when the store is not asked) too: the counter says how many sequences were
/// routed by the hash alone.
#[tokio::test(flavor = "current_thread")]
async fn every_request_without_the_store_is_counted() {
    use tensorgate::config::{PinStoreKind, PinsConfig};
    use tensorgate::pinstore::PinStore;
    use tensorgate::routing::pins::PinTable;

    // A port with nothing listening: every connection is refused at once.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let idle = Duration::from_secs(60);
    let metrics = tensorgate::metrics::Metrics::new(false);
    let config = PinsConfig {
        store: PinStoreKind::Redis,
        url: Some(format!("redis://127.0.0.1:{port}")),
        ..PinsConfig::default()
    };
    let store = PinStore::from_config(&config, idle, &metrics)
        .unwrap()
        .expect("a Redis store");
    let table = PinTable::new(100, idle);
    for id in 0..6u64 {
        let answer = store
            .claim(&table, "m", &SequenceId::Uint(id), "http://a")
            .await;
        assert_eq!(answer, None, "sequence {id}");
    }
    assert_eq!(
        metrics.pin_store_errors.with_label_values(&["claim"]).get(),
        6
    );
    assert_eq!(metrics.pin_store_up.get(), 0);
}

/// Claims that wait together go to Redis together: one script call answers 120 of them,
/// each with its own key's holder. A key claimed twice in the batch gets the first claim's
/// backend both times, and a key another replica holds keeps its holder.
#[tokio::test(flavor = "current_thread")]
async fn concurrent_claims_share_one_round_trip() {
    use tensorgate::config::{PinStoreKind, PinsConfig};
    use tensorgate::pinstore::PinStore;
    use tensorgate::routing::pins::PinTable;

    let redis = Redis::start().await;
    let idle = Duration::from_secs(60);
    let metrics = tensorgate::metrics::Metrics::new(false);
    let config = PinsConfig {
        store: PinStoreKind::Redis,
        url: Some(redis.url()),
        ..PinsConfig::default()
    };
    let store = PinStore::from_config(&config, idle, &metrics)
        .unwrap()
        .expect("a Redis store");
    let table = PinTable::new(1000, idle);
    // Ids 0..20 are held elsewhere already; then the connection is warm, so that the batch
    // below is the only round trip counted.
    for id in 0..20u64 {
        let key = tensorgate::pinstore::pin_key(PREFIX, "m", &SequenceId::Uint(id));
        redis.set(&key, "http://elsewhere");
    }
    let warm = store
        .claim(&table, "m", &SequenceId::Uint(1000), "http://a")
        .await;
    assert_eq!(
        warm,
        Some(Claimed {
            holder: "http://a".into(),
            created: true
        }),
        "a free key is claimed for the chosen backend"
    );
    let trips = || {
        metrics
            .pin_store_operations
            .with_label_values(&["claim"])
            .get()
    };
    let before = trips();

    // 60 ids, each claimed twice (for "a", then for "b"), all started in one poll.
    let ids: Vec<(SequenceId, &str)> = (0..60u64)
        .flat_map(|id| {
            [
                (SequenceId::Uint(id), "http://a"),
                (SequenceId::Uint(id), "http://b"),
            ]
        })
        .collect();
    let answers = futures_util::future::join_all(
        ids.iter()
            .map(|(id, chosen)| store.claim(&table, "m", id, chosen)),
    )
    .await;
    assert_eq!(trips() - before, 1, "120 waiting claims, one round trip");
    for ((id, chosen), answer) in ids.iter().zip(&answers) {
        let SequenceId::Uint(n) = id else {
            unreachable!()
        };
        // The holder: the one already stored, else the first claim's choice, which only
        // the first claim created.
        let holder = if *n < 20 {
            "http://elsewhere"
        } else {
            "http://a"
        };
        let expected = Claimed {
            holder: holder.into(),
            created: *n >= 20 && *chosen == "http://a",
        };
        assert_eq!(
            answer.as_ref(),
            Some(&expected),
            "sequence {n} claimed for {chosen}"
        );
        let key = tensorgate::pinstore::pin_key(PREFIX, "m", id);
        assert_eq!(redis.get(&key).as_deref(), Some(holder));
        assert!(
            (1..=60_000).contains(&redis.pttl(&key)),
            "{key} has the idle TTL"
        );
    }
    assert_eq!(
        metrics.pin_store_errors.with_label_values(&["claim"]).get(),
        0
    );
}

/// A pin that another replica changed in Redis (here: set by hand, to a worker that holds
/// the sequence's state) is followed once this replica renews its cached copy: the renewal
/// reads the store's holder, and the requests after it go there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pin_changed_in_the_store_is_followed_after_the_renewal() {
    let redis = Redis::start().await;
    let workers = Worker::start_many(2, &["accumulate"]).await;
    let all: Vec<&Worker> = workers.iter().collect();
    // Pins are trusted for the idle timeout (4 s) and renewed every quarter of it (1 s). The
    // loop below ends well before the pin would turn stale (which would also make the
    // replica ask the store), so what it sees is the renewal's doing.
    let fleet = pins_toml(
        "refresh_interval_ms = 200\nsequence_idle_timeout_ms = 4000",
        &redis.url(),
    );
    let gw = start_gateway(gateway_config(&all, &fleet)).await;
    let b = base(&gw);
    let client = http_client();

    let r = accumulate(&client, &b, 1, true, false, 1).await;
    assert_eq!(r.status, 200, "{r:?}");
    let here = r.backend.clone().expect("the backend is named");
    let other = workers.iter().find(|w| w.name != here).unwrap();
    // The other worker holds a sequence 1 of its own (sum 100), and the store names it.
    let direct = accumulate(&client, &other.url, 1, true, false, 100).await;
    assert_eq!(direct.output_int("OUTPUT0"), Some(100), "{direct:?}");
    redis.set("tensorgate:pin:accumulate:u:1", &other.url);

    // Requests keep coming every 30 ms; after the first renewal they reach the other worker,
    // which adds to its own sum.
    let mut followed = None;
    for _ in 0..80 {
        tokio::time::sleep(Duration::from_millis(30)).await;
        let r = accumulate(&client, &b, 1, false, false, 1).await;
        assert_eq!(r.status, 200, "{r:?}");
        if r.backend.as_deref() == Some(other.name.as_str()) {
            followed = Some(r);
            break;
        }
    }
    let r = followed.expect("the gateway never followed the store's pin");
    assert_eq!(r.output_int("OUTPUT0"), Some(101), "{r:?}");
    assert_eq!(
        gw.gateway
            .router
            .pins
            .get("accumulate", &SequenceId::Uint(1))
            .as_deref(),
        Some(other.url.as_str())
    );
    assert_eq!(store_errors(&gw), 0);
    gw.shutdown().await;
}

/// A sequence id started again on another replica runs where the store pins it, if that
/// replica can use the backend: a replica that cached the pin keeps sending the id's next
/// requests there, so moving the new sequence elsewhere would leave them reaching the old
/// sequence's state (a user saw sums of 1011 where 1100 was right).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_on_another_replica_keeps_the_stored_backend() {
    let redis = Redis::start().await;
    let workers = Worker::start_many(3, &["accumulate"]).await;
    let (two, three): (Vec<&Worker>, Vec<&Worker>) =
        (workers.iter().take(2).collect(), workers.iter().collect());
    let fleet = pins_toml("sequence_idle_timeout_ms = 60000", &redis.url());
    // A knows two workers, B all three: B's hash sends some ids where A's cannot.
    let a = start_gateway(gateway_config(&two, &fleet)).await;
    let b = start_gateway(gateway_config(&three, &fleet)).await;
    let (base_a, base_b) = (base(&a), base(&b));
    let client = http_client();
    for id in 1..=24u64 {
        let first = accumulate(&client, &base_a, id, true, false, 1).await;
        let pinned = first.backend.clone().expect("the backend is named");
        let r = accumulate(&client, &base_a, id, false, false, 10).await;
        assert_eq!(r.output_int("OUTPUT0"), Some(11), "{r:?}");
        let restart = accumulate(&client, &base_b, id, true, false, 100).await;
        assert_eq!(
            (restart.output_int("OUTPUT0"), restart.backend.as_deref()),
            (Some(100), Some(pinned.as_str())),
            "sequence {id}: {restart:?}"
        );
        let next = accumulate(&client, &base_a, id, false, false, 1000).await;
        assert_eq!(
            (next.output_int("OUTPUT0"), next.backend.as_deref()),
            (Some(1100), Some(pinned.as_str())),
            "sequence {id}: {next:?}"
        );
    }
    assert_eq!(store_errors(&a) + store_errors(&b), 0);
    a.shutdown().await;
    b.shutdown().await;
}

/// A start that moves a pin (the replica that takes it cannot use the stored backend) is
/// announced: a replica that cached the old backend drops it at once and follows the store,
/// instead of sending the id's next requests to the old sequence's state until its renewal
/// (a user saw 200s with the old sums for up to a quarter of the idle timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_that_moves_a_pin_is_followed_by_every_replica_at_once() {
    let redis = Redis::start().await;
    let workers = Worker::start_many(2, &["accumulate"]).await;
    let (both, second): (Vec<&Worker>, Vec<&Worker>) =
        (workers.iter().collect(), vec![&workers[1]]);
    // Renewals every 15 s: none comes within the test, so only the announcement can move A.
    let fleet = pins_toml("sequence_idle_timeout_ms = 60000", &redis.url());
    let a = start_gateway(gateway_config(&both, &fleet)).await;
    let b = start_gateway(gateway_config(&second, &fleet)).await;
    let (base_a, base_b) = (base(&a), base(&b));
    let client = http_client();
    let mut moved = 0;
    for id in 1..=16u64 {
        let first = accumulate(&client, &base_a, id, true, false, 1).await;
        assert_eq!(first.status, 200, "{first:?}");
        if first.backend.as_deref() != Some(workers[0].name.as_str()) {
            continue;
        }
        moved += 1;
        let r = accumulate(&client, &base_a, id, false, false, 10).await;
        assert_eq!(r.output_int("OUTPUT0"), Some(11), "{r:?}");
        // B knows only the second worker: its start runs there and stores it.
        let restart = accumulate(&client, &base_b, id, true, false, 100).await;
        assert_eq!(
            (restart.output_int("OUTPUT0"), restart.backend.as_deref()),
            (Some(100), Some(workers[1].name.as_str())),
            "sequence {id}: {restart:?}"
        );
        let seq = SequenceId::Uint(id);
        let followed = eventually(100, Duration::from_millis(20), || async {
            a.gateway.router.pins.get("accumulate", &seq).as_deref()
                != Some(workers[0].url.as_str())
        })
        .await;
        assert!(followed, "sequence {id}: A kept its pin to the old backend");
        let next = accumulate(&client, &base_a, id, false, false, 1000).await;
        assert_eq!(
            (next.output_int("OUTPUT0"), next.backend.as_deref()),
            (Some(1100), Some(workers[1].name.as_str())),
            "sequence {id}: {next:?}"
        );
    }
    assert!(
        moved >= 3,
        "only {moved} of 16 sequences started on the first worker"
    );
    assert_eq!(store_errors(&a) + store_errors(&b), 0);
    a.shutdown().await;
    b.shutdown().await;
}

/// A replica whose cached pin is out of date (it missed that the id was started again on
/// another backend) ends or loses the sequence it knows, and leaves the store's pin, which
/// belongs to a sequence that lives, where it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_out_of_date_pin_removes_no_live_pin_from_the_store() {
    let redis = Redis::start().await;
    let workers = Worker::start_many(2, &["accumulate"]).await;
    let all: Vec<&Worker> = workers.iter().collect();
    let fleet = pins_toml("sequence_idle_timeout_ms = 60000", &redis.url());
    let gw = start_gateway(gateway_config(&all, &fleet)).await;
    let b = base(&gw);
    let client = http_client();
    let key = format!("{PREFIX}accumulate:u:61");
    let r = accumulate(&client, &b, 61, true, false, 1).await;
    assert_eq!(r.status, 200, "{r:?}");
    let other = workers
        .iter()
        .find(|w| Some(&w.name) != r.backend.as_ref())
        .unwrap();
    // Written behind the gateway's back, without an announcement: its cache is out of date.
    redis.set(&key, &other.url);
    let end = accumulate(&client, &b, 61, false, true, 2).await;
    assert_eq!(
        (
            end.status,
            end.output_int("OUTPUT0"),
            end.backend.as_deref()
        ),
        (200, Some(3), r.backend.as_deref()),
        "{end:?}"
    );
    assert_eq!(redis.get(&key), Some(other.url.clone()));
    assert_eq!(store_errors(&gw), 0);
    gw.shutdown().await;
}

/// Counts the lookups of every name it answers for.
#[derive(Clone, Default)]
struct CountingResolver {
    inner: MutableResolver,
    lookups: Arc<AtomicUsize>,
}

impl tensorgate::fleet::discovery::Resolve for CountingResolver {
    fn resolve<'a>(
        &'a self,
        host: &'a str,
    ) -> tensorgate::fleet::backend::BoxFuture<'a, Result<Vec<std::net::IpAddr>, String>> {
        self.lookups.fetch_add(1, Ordering::SeqCst);
        self.inner.resolve(host)
    }
}

/// Shared pins that name a backend this replica cannot find make it resolve its DNS
/// backends again, but at most once a second, however many requests ask at once: a burst
/// of such sequences is not a burst of DNS queries. The requests get a 503 naming the
/// backend, since their state lives where this replica cannot reach. A pin naming a backend
/// this replica has, but down, resolves nothing: DNS would only find it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediscovery_for_unknown_pinned_backends_runs_once_a_second() {
    let redis = Redis::start().await;
    let mut worker = Worker::start("w", "127.0.0.2", 0, &["accumulate"]).await;
    // A second keeps the model served once the first is stopped.
    let _second = Worker::start("w2", "127.0.0.4", worker.port, &["accumulate"]).await;
    let resolver = CountingResolver::default();
    resolver
        .inner
        .set("workers.test", &["127.0.0.2", "127.0.0.4"]);
    let fleet = pins_toml(
        "refresh_interval_ms = 200\ndns_interval_ms = 3600000",
        &redis.url(),
    );
    let gw = start_dns_gateway(&fleet, worker.port, Arc::new(resolver.clone())).await;
    let b = base(&gw);
    // Another replica pinned these sequences to an address this one never resolves.
    let elsewhere = format!("http://127.0.0.3:{}", worker.port);
    for id in 1..=40u64 {
        redis.set(&format!("{PREFIX}accumulate:u:{id}"), &elsewhere);
    }
    let client = http_client();
    let burst = |ids: std::ops::RangeInclusive<u64>| {
        let (client, b, elsewhere) = (client.clone(), b.clone(), elsewhere.clone());
        async move {
            let ids: Vec<u64> = ids.collect();
            let replies = futures_util::future::join_all(ids.iter().map(|&id| {
                let (client, b) = (client.clone(), b.clone());
                async move { accumulate(&client, &b, id, false, false, 1).await }
            }))
            .await;
            for (r, id) in replies.iter().zip(ids) {
                assert_eq!(r.status, 503, "{r:?}");
                let error = r.body["error"].as_str().unwrap_or_default();
                assert!(
                    error.contains(&format!(
                        "({elsewhere}) is not available to this replica (unhealthy, ejected, or not in its fleet); if it is gone, the sequence's state is lost"
                    )),
                    "sequence {id}: {error}"
                );
            }
        }
    };
    let before = resolver.lookups.load(Ordering::SeqCst);
    burst(1..=20).await;
    assert_eq!(
        resolver.lookups.load(Ordering::SeqCst) - before,
        1,
        "20 requests at once resolved the name once"
    );
    // A second later the next ask resolves again.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    burst(21..=40).await;
    assert_eq!(resolver.lookups.load(Ordering::SeqCst) - before, 2);
    // A pin naming a backend this replica has, down: DNS would only find it again.
    worker.process.kill();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let known = format!("http://127.0.0.2:{}", worker.port);
    let usable = || {
        let catalog = gw.gateway.fleet.catalog();
        let entry = catalog
            .get("accumulate")
            .expect("the second worker serves it");
        entry
            .ready
            .iter()
            .any(|h| h.key == known && !h.health.is_ejected())
    };
    while usable() {
        assert!(
            std::time::Instant::now() < deadline,
            "the dead worker stays usable"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(1100)).await;
    redis.set(&format!("{PREFIX}accumulate:u:41"), &known);
    let r = accumulate(&client, &b, 41, false, false, 1).await;
    assert_eq!(r.status, 503, "{r:?}");
    assert_eq!(
        resolver.lookups.load(Ordering::SeqCst) - before,
        2,
        "no lookup for a backend the fleet has"
    );
    gw.shutdown().await;
}
