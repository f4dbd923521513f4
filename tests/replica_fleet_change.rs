//! Sequence affinity through a fleet change with several gateway replicas: a replica that
//! never saw a live sequence must still find its backend after a join moved the sequence's
//! hash elsewhere (the past-table fallback of `routing::Route`).

use crate::common_fleet;

use std::collections::BTreeSet;

use common_fleet::*;
use tensorgate::protocol::SequenceId;
use tensorgate::routing::sequence_key;
use tensorgate::run::Running;

const SEQ_MODELS: &[&str] = &["simple", "accumulate"];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn live_sequences_survive_a_join_across_three_replicas() {
    let workers = Worker::start_many(4, SEQ_MODELS).await;
    let first3: Vec<&Worker> = workers[..3].iter().collect();
    let all4: Vec<&Worker> = workers.iter().collect();
    let fleet = "refresh_interval_ms = 200";
    let mut gateways = Vec::new();
    for _ in 0..3 {
        gateways.push(start_gateway(gateway_config(&first3, fleet)).await);
    }
    let bases: Vec<String> = gateways.iter().map(base).collect();

    // 90 live sequences, each started on one random replica only: the other two have no pin.
    let mut rng = fastrand::Rng::with_seed(0x5eed_0101);
    let live: Vec<Seq> = (1..=90).map(|id| Seq::new(id, 5, &mut rng)).collect();
    let live = drive(live, &bases, 3, 0x5eed_0102, 1)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(live.iter().all(|s| s.next == 1));

    // The 4th worker joins on every replica.
    for gw in &gateways {
        gw.reload(gateway_config(&all4, fleet))
            .await
            .expect("the reload applies");
    }
    let names: BTreeSet<String> = workers.iter().map(|w| w.name.clone()).collect();
    for gw in &gateways {
        let ready: BTreeSet<String> = gw
            .gateway
            .fleet
            .catalog()
            .get("accumulate")
            .map(|e| e.ready.iter().map(|h| h.name.to_string()).collect())
            .unwrap_or_default();
        assert_eq!(ready, names, "every replica has the new worker ready");
    }
    // The test is only worth something if the join moved some live sequences' hash.
    let moved = moved_by_the_change(&gateways[0], &live);

    // The live sequences finish over random replicas, interleaved with 90 new ones.
    // Seq::step checks every running sum and that each request reached the backend of the
    // sequence's start.
    let fresh: Vec<Seq> = (1001..=1090).map(|id| Seq::new(id, 3, &mut rng)).collect();
    let mut all = live.clone();
    all.extend(fresh);
    let done = drive(all, &bases, 6, 0x5eed_0103, usize::MAX)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    for s in &done {
        assert!(s.done(), "sequence {} did not finish", s.id);
    }
    for id in &moved {
        let s = done.iter().find(|s| s.id == *id).unwrap();
        assert_ne!(s.backend.as_deref(), Some("w3"), "sequence {id} moved");
    }
    // Moved sequences really did reach replicas that had never seen them.
    let unseen_hops = moved
        .iter()
        .map(|id| done.iter().find(|s| s.id == *id).unwrap())
        .filter(|s| s.via[1..].iter().any(|v| *v != s.via[0]))
        .count();
    assert!(
        unseen_hops > 0,
        "no moved sequence hopped to another replica"
    );
    let on_new = done
        .iter()
        .filter(|s| s.id > 1000 && s.backend.as_deref() == Some("w3"))
        .count();
    assert!(on_new > 0, "no new sequence reached the added worker");

    // A sequence no backend knows, whose hash moved: the new owner and then the past one
    // refuse it, and the answer is the new owner's refusal, with no pin left behind.
    let catalog = gateways[0].gateway.fleet.catalog();
    let entry = catalog.get("accumulate").unwrap();
    let past = &entry.history[0];
    let unknown = (5000..10_000u64)
        .find(|id| {
            let key = sequence_key("accumulate", &SequenceId::Uint(*id));
            past.members[past.table.lookup(key).unwrap()]
                != entry.ready[entry.table.lookup(key).unwrap()].key
        })
        .expect("some key moved");
    let r = accumulate(&http_client(), &bases[0], unknown, false, false, 1).await;
    assert_eq!(r.status, 400, "{r:?}");
    assert_eq!(
        r.error(),
        Some(format!("inference request for sequence {unknown} to model 'accumulate' must specify the START flag on the first request of the sequence").as_str())
    );
    assert_eq!(r.backend, Some(hash_owner(&gateways[0], unknown)));
    assert!(gateways[0]
        .gateway
        .router
        .pins
        .get("accumulate", &SequenceId::Uint(unknown))
        .is_none());

    for gw in gateways {
        gw.shutdown().await;
    }
}

const JOIN_FLEET: &str = "refresh_interval_ms = 200";

/// Three workers and two replicas that know the first two.
async fn two_replicas_of_two_workers() -> (Vec<Worker>, Running, Running) {
    let workers = Worker::start_many(3, SEQ_MODELS).await;
    let first2: Vec<&Worker> = workers[..2].iter().collect();
    let g1 = start_gateway(gateway_config(&first2, JOIN_FLEET)).await;
    let g2 = start_gateway(gateway_config(&first2, JOIN_FLEET)).await;
    (workers, g1, g2)
}

/// The third worker joins both replicas, and both have it ready.
async fn third_joins(workers: &[Worker], replicas: [&Running; 2]) {
    let all3: Vec<&Worker> = workers.iter().collect();
    for gw in replicas {
        gw.reload(gateway_config(&all3, JOIN_FLEET))
            .await
            .expect("the reload applies");
        let seen = eventually(100, std::time::Duration::from_millis(100), || async {
            ready_names(gw).contains(&workers[2].name)
        })
        .await;
        assert!(seen, "the new worker is ready");
    }
}

/// A start of a live id through one replica restarts the sequence where it lives, even after
/// a join moved the id's hash elsewhere: another replica that pins the id keeps reaching the
/// new sequence, not the old one's state (a tester saw 6 of 40 ids answer 101 there, where 2
/// was right, when the start went to the new hash owner and left the old state live).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restart_after_a_join_is_seen_by_every_replica() {
    let (workers, g1, g2) = two_replicas_of_two_workers().await;
    let (b1, b2) = (base(&g1), base(&g2));
    let client = http_client();
    let ids = 1..=40u64;
    for id in ids.clone() {
        let r = accumulate(&client, &b1, id, true, false, 100).await;
        assert_eq!(r.output_int("OUTPUT0"), Some(100), "{id}: {r:?}");
        let r = accumulate(&client, &b2, id, false, false, 1).await;
        assert_eq!(r.output_int("OUTPUT0"), Some(101), "{id}: {r:?}");
    }
    third_joins(&workers, [&g1, &g2]).await;
    let new_worker = &workers[2].name;
    let mut moved_by_hash = 0;
    for id in ids {
        let r = accumulate(&client, &b1, id, true, false, 1).await;
        assert_eq!(r.output_int("OUTPUT0"), Some(1), "{id}: {r:?}");
        let again = accumulate(&client, &b2, id, false, false, 1).await;
        assert_eq!(
            (again.output_int("OUTPUT0"), &again.backend),
            (Some(2), &r.backend),
            "{id}: the restarted sequence, through the other replica"
        );
        if r.backend.as_ref() == Some(new_worker) {
            moved_by_hash += 1;
        }
    }
    assert_eq!(moved_by_hash, 0, "a restart went to the new worker");
    g1.shutdown().await;
    g2.shutdown().await;
}

/// Concurrent requests of a live sequence at a replica that has no pin for it, after a join
/// moved its hash: each finds the sequence on its past owner. The first used to pin the new
/// hash owner before any backend had accepted it, and the others took that guess for a
/// fact: its refusal read as a lost sequence (503) while the state lived on (a tester saw
/// up to 4 of 8 such requests fail).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_requests_of_a_moved_sequence_all_find_it() {
    let (workers, g1, g2) = two_replicas_of_two_workers().await;
    let client = http_client();
    let ids = 1..=30u64;
    for id in ids.clone() {
        let r = accumulate(&client, &base(&g1), id, true, false, 100).await;
        assert_eq!(r.output_int("OUTPUT0"), Some(100), "{id}: {r:?}");
    }
    third_joins(&workers, [&g1, &g2]).await;
    // g2 never saw these sequences: 8 requests of each at once.
    let b2 = base(&g2);
    for id in ids {
        let replies = futures_util::future::join_all(
            (0..8).map(|_| accumulate(&client, &b2, id, false, false, 1)),
        )
        .await;
        let mut sums: Vec<i64> = replies
            .iter()
            .map(|r| {
                assert_eq!(r.status, 200, "{id}: {r:?}");
                r.output_int("OUTPUT0").unwrap()
            })
            .collect();
        sums.sort();
        assert_eq!(sums, (101..=108).collect::<Vec<_>>(), "{id}");
    }
    g1.shutdown().await;
    g2.shutdown().await;
}
