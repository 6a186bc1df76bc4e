//! Batches: duplicates, partial failures, FIFO groups, transactional
//! records, takeovers and panics, with each source's semantics.

use super::*;

#[tokio::test]
async fn duplicates_in_and_across_batches_run_once() {
    let sqs = SqsBatch::new(Engine::builder(MemoryStore::new()).build(), "queue")
        .key(|m: &SqsMessage| m.body.clone());
    let (seen, handler) = recorder();
    let response = sqs
        .process(
            batch(vec![
                message("m1", "a", None),
                message("m2", "b", None),
                message("m3", "a", None),
            ]),
            &handler,
        )
        .await
        .expect("a partial batch response");
    assert!(response.batch_item_failures.is_empty(), "{response:?}");
    let response = sqs
        .process(
            batch(vec![message("m4", "b", None), message("m5", "c", None)]),
            &handler,
        )
        .await
        .expect("a partial batch response");
    assert!(response.batch_item_failures.is_empty());
    let mut ran = seen.lock().unwrap().clone();
    ran.sort();
    assert_eq!(ran, ["a", "b", "c"]);
}

#[tokio::test]
async fn only_failed_and_in_progress_records_are_reported() {
    let store = MemoryStore::new();
    let engine = Engine::builder(store.clone()).build();
    let sqs = SqsBatch::new(engine.clone(), "queue");
    // Another invocation holds m3's key right now.
    let now = crate::Clock::now_ms(&crate::SystemClock);
    let claim = Claim {
        id: engine.record_id("queue", "m3"),
        owner: OwnerToken::generate().expect("the OS random source"),
        fingerprint: Fingerprint::of_bytes(b"busy"),
        now_ms: now,
        lease_until_ms: now + 30_000,
        expiration_s: now / 1000 + 3600,
        attempt: 1,
        first_started_ms: now,
    };
    store.claim(&claim).await.unwrap();
    let (seen, handler) = recorder();
    let response = sqs
        .process(
            batch(vec![
                message("m1", "ok-1", None),
                message("m2", "fail-2", None),
                message("m3", "busy", None),
                message("m4", "ok-4", None),
            ]),
            &handler,
        )
        .await
        .expect("a partial batch response");
    let mut failed = failed_ids(&response);
    failed.sort();
    assert_eq!(failed, ["m2", "m3"]);
    assert!(
        !seen.lock().unwrap().contains(&"busy".to_string()),
        "m3 did not run here"
    );

    // The redelivery of the failed record runs again; the others replay.
    let response = sqs
        .process(
            batch(vec![
                message("m1", "ok-1", None),
                message("m2", "fail-2", None),
            ]),
            &handler,
        )
        .await
        .expect("a partial batch response");
    assert_eq!(failed_ids(&response), ["m2"]);
    assert_eq!(
        seen.lock().unwrap().iter().filter(|b| *b == "ok-1").count(),
        1
    );
    assert_eq!(
        seen.lock()
            .unwrap()
            .iter()
            .filter(|b| *b == "fail-2")
            .count(),
        2
    );
}

#[tokio::test]
async fn fifo_groups_run_in_order_and_stop_at_their_first_failure() {
    let sqs = SqsBatch::new(Engine::builder(MemoryStore::new()).build(), "fifo").concurrency(4);
    let order = Arc::new(Mutex::new(HashMap::<String, Vec<String>>::new()));
    let log = Arc::clone(&order);
    let handler = move |message: SqsMessage| {
        let log = Arc::clone(&log);
        async move {
            let group = message.attributes["MessageGroupId"].clone();
            let body = message.body.unwrap_or_default();
            // Yield, so groups interleave if they can.
            tokio::time::sleep(Duration::from_millis(5)).await;
            log.lock()
                .unwrap()
                .entry(group)
                .or_default()
                .push(body.clone());
            if body.starts_with("fail") {
                Err(body)
            } else {
                Ok(())
            }
        }
    };
    let response = sqs
        .process(
            batch(vec![
                message("a1", "a-1", Some("A")),
                message("b1", "b-1", Some("B")),
                message("a2", "a-2", Some("A")),
                message("b2", "fail-b-2", Some("B")),
                message("a3", "a-3", Some("A")),
                message("b3", "b-3", Some("B")),
            ]),
            handler,
        )
        .await
        .expect("a partial batch response");
    let order = order.lock().unwrap();
    assert_eq!(order["A"], ["a-1", "a-2", "a-3"]);
    assert_eq!(
        order["B"],
        ["b-1", "fail-b-2"],
        "b-3 must not run after b-2 failed"
    );
    let mut failed = failed_ids(&response);
    failed.sort();
    assert_eq!(failed, ["b2", "b3"]);
}

#[tokio::test]
async fn an_unavailable_store_reports_every_record() {
    let store = MemoryStore::new();
    let sqs = SqsBatch::new(Engine::builder(store.clone()).build(), "queue");
    // Each record's claim, and the read that confirms the outage.
    store.fail_next(6);
    let (seen, handler) = recorder();
    let response = sqs
        .process(
            batch(vec![
                message("m1", "a", None),
                message("m2", "b", None),
                message("m3", "c", None),
            ]),
            &handler,
        )
        .await
        .expect("a partial batch response");
    assert_eq!(response.batch_item_failures.len(), 3);
    assert!(
        seen.lock().unwrap().is_empty(),
        "nothing ran without a claim"
    );
}

#[tokio::test]
async fn transactional_records_commit_their_writes_once() {
    let store = MemoryStore::new();
    let sqs = SqsBatch::new(Engine::builder(store.clone()).build(), "queue")
        .key(|m: &SqsMessage| m.body.clone());
    let handler = |message: SqsMessage| {
        let body = message.body.unwrap_or_default();
        std::future::ready(Ok::<_, String>((
            (),
            vec![MemoryWrite::put_if_absent(format!("sent#{body}"), "1")],
        )))
    };
    let response = sqs
        .process_transactional(
            batch(vec![message("m1", "x", None), message("m2", "x", None)]),
            handler,
        )
        .await
        .expect("a partial batch response");
    assert!(response.batch_item_failures.is_empty(), "{response:?}");
    assert_eq!(store.item("sent#x").as_deref(), Some(&b"1"[..]));
}

#[tokio::test]
async fn a_record_that_takes_over_a_crashed_delivery_is_told_so() {
    let store = MemoryStore::new();
    let engine = Engine::builder(store.clone()).build();
    let sqs = SqsBatch::new(engine.clone(), "queue");
    // An earlier delivery of m1 claimed it and died; its lease has passed.
    let now = crate::Clock::now_ms(&crate::SystemClock);
    let crashed = Claim {
        id: engine.record_id("queue", "m1"),
        owner: OwnerToken::generate().expect("the OS random source"),
        fingerprint: Fingerprint::of_bytes(b"pay"),
        now_ms: now - 60_000,
        lease_until_ms: now - 30_000,
        expiration_s: now / 1000 + 3600,
        attempt: 1,
        first_started_ms: now - 60_000,
    };
    store.claim(&crashed).await.unwrap();
    let told = Arc::new(Mutex::new(Vec::new()));
    let handler = |message: SqsMessage| {
        let told = Arc::clone(&told);
        async move {
            let takeover = ClaimHandle::current().and_then(|claim| claim.takeover());
            told.lock()
                .unwrap()
                .push((message.message_id.unwrap_or_default(), takeover));
            Ok::<_, String>(())
        }
    };
    let response = sqs
        .process(
            batch(vec![
                message("m1", "pay", None),
                message("m2", "other", None),
            ]),
            handler,
        )
        .await
        .expect("a partial batch response");
    assert!(response.batch_item_failures.is_empty(), "{response:?}");
    let mut told = told.lock().unwrap().clone();
    told.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        told,
        [
            (
                "m1".to_string(),
                Some(crate::Takeover {
                    attempt: 2,
                    first_started_at_ms: now - 60_000
                })
            ),
            ("m2".to_string(), None),
        ]
    );
}

#[tokio::test]
async fn an_event_without_records_fails_on_every_source_instead_of_succeeding() {
    let engine = Engine::builder(MemoryStore::new()).build();
    let never = |_record| async { Err::<(), _>("must not run") };

    let sqs = SqsBatch::new(engine.clone(), "q")
        .process(batch(Vec::new()), |m: SqsMessage| never(m.message_id))
        .await
        .expect("a partial batch response");
    let ids: Vec<&str> = failed_ids(&sqs);
    assert_eq!(
        ids,
        [""],
        "an empty identifier: Lambda retries the whole batch"
    );

    let kinesis = KinesisBatch::new(engine.clone(), "k")
        .process(
            LambdaEvent::new(Default::default(), Context::default()),
            |r: aws_lambda_events::kinesis::KinesisEventRecord| never(r.event_id),
        )
        .await
        .expect("a partial batch response");
    assert_eq!(kinesis.batch_item_failures.len(), 1);
    assert_eq!(
        kinesis.batch_item_failures[0].item_identifier.as_deref(),
        Some("")
    );

    let kafka = KafkaBatch::new(engine, "t")
        .process(
            LambdaEvent::new(Default::default(), Context::default()),
            |r: aws_lambda_events::kafka::KafkaRecord| never(r.topic),
        )
        .await
        .expect_err("no records");
    assert!(
        kafka
            .to_string()
            .starts_with("1 of 1 Kafka records failed ((no id))"),
        "{kafka}"
    );
}

#[tokio::test]
async fn batch_failed_names_the_first_failures_and_counts_the_rest() {
    let engine = Engine::builder(MemoryStore::new()).build();
    let event: aws_lambda_events::activemq::ActiveMqEvent =
        serde_json::from_value(serde_json::json!({
            "eventSource": "aws:amq",
            "messages": (0..9).map(|i| serde_json::json!({
                "messageID": format!("ID:{i}"), "messageType": "jms/text-message",
                "timestamp": 1_763_800_000_000_i64, "deliveryMode": 2, "redelivered": false,
                "expiration": 0, "priority": 4, "brokerInTime": 0, "brokerOutTime": 0,
                "properties": {},
                "destination": { "physicalName": if i % 2 == 0 { "even" } else { "odd" } },
                "data": "e30="
            })).collect::<Vec<_>>()
        }))
        .expect("an ActiveMQ event");
    let runs = Arc::new(Mutex::new(Vec::new()));
    let error = ActiveMqBatch::new(engine, "mq")
        .process(
            LambdaEvent::new(event, Context::default()),
            |message: aws_lambda_events::activemq::ActiveMqMessage| {
                let runs = Arc::clone(&runs);
                async move {
                    let id = message.message_id.unwrap_or_default();
                    runs.lock().unwrap().push(id.clone());
                    if id == "ID:2" {
                        return Err(format!("{id} failed"));
                    }
                    Ok(())
                }
            },
        )
        .await
        .expect_err("ID:2 failed");
    assert_eq!(
        error.to_string(),
        "1 of 9 ActiveMQ records failed (ID:2) and 3 were held back behind them; \
         the invocation fails so that Lambda delivers the batch again, where the \
         records that completed replay"
    );
    let mut runs = runs.lock().unwrap().clone();
    runs.sort();
    // The "even" destination stopped at ID:2; "odd" ran to its end.
    assert_eq!(error.report().count(RecordStatus::HeldBack), 3);
    assert_eq!(runs, ["ID:0", "ID:1", "ID:2", "ID:3", "ID:5", "ID:7"]);
}

/// Runs `body`'s record: sleeps, then panics for bodies that start with
/// "panic", fails those that start with "fail", and succeeds otherwise.
async fn slow_or_panicking(runs: Arc<Mutex<Vec<String>>>, body: String) -> Result<String, String> {
    runs.lock().unwrap().push(body.clone());
    if body.starts_with("panic") {
        panic!("the handler panicked on {body}");
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    if body.starts_with("fail") {
        return Err(format!("cannot process {body}"));
    }
    Ok(body)
}

#[tokio::test]
async fn a_panicking_record_fails_alone_and_the_records_beside_it_finish() {
    let sqs = SqsBatch::new(Engine::builder(MemoryStore::new()).build(), "queue");
    let runs = Arc::new(Mutex::new(Vec::new()));
    let handler = |message: SqsMessage| {
        slow_or_panicking(Arc::clone(&runs), message.body.unwrap_or_default())
    };
    let event = || {
        batch(vec![
            message("m1", "ok-1", None),
            message("m2", "panic-2", None),
            message("m3", "ok-3", None),
        ])
    };
    let response = sqs.process(event(), handler).await.expect("a response");
    assert_eq!(failed_ids(&response), ["m2"]);
    // The records beside it ran to the end and stored their results: the
    // redelivery replays them. The panicking one released its claim (item
    // 9), so the redelivery runs it again at once, not "in progress" until
    // the dead attempt's lease passes.
    runs.lock().unwrap().clear();
    let again = sqs.process(event(), handler).await.expect("a response");
    assert_eq!(failed_ids(&again), ["m2"]);
    let ran_again = runs.lock().unwrap().clone();
    assert_eq!(
        ran_again,
        ["panic-2"],
        "only the panicking record runs again"
    );
}

#[tokio::test]
async fn a_panicking_record_stops_its_ordered_group_like_an_error() {
    let sqs = SqsBatch::new(Engine::builder(MemoryStore::new()).build(), "fifo");
    let runs = Arc::new(Mutex::new(Vec::new()));
    let handler = |message: SqsMessage| {
        slow_or_panicking(Arc::clone(&runs), message.body.unwrap_or_default())
    };
    let response = sqs
        .process(
            batch(vec![
                message("a1", "ok-a1", Some("A")),
                message("a2", "panic-a2", Some("A")),
                message("a3", "ok-a3", Some("A")),
                message("b1", "ok-b1", Some("B")),
            ]),
            handler,
        )
        .await
        .expect("a response");
    assert_eq!(failed_ids(&response), ["a2", "a3"]);
    let mut ran = runs.lock().unwrap().clone();
    ran.sort();
    assert_eq!(ran, ["ok-a1", "ok-b1", "panic-a2"]);
}

#[tokio::test]
async fn a_panicking_key_closure_fails_only_its_record() {
    let sqs = SqsBatch::new(Engine::builder(MemoryStore::new()).build(), "queue").key(
        |message: &SqsMessage| {
            let body = message.body.clone()?;
            assert!(!body.starts_with("panic"), "the key closure panicked");
            Some(body)
        },
    );
    let (_, handler) = recorder();
    let response = sqs
        .process(
            batch(vec![
                message("m1", "ok", None),
                message("m2", "panic", None),
            ]),
            &handler,
        )
        .await
        .expect("a response");
    assert_eq!(failed_ids(&response), ["m2"]);
}

#[tokio::test]
async fn a_standard_queue_with_message_groups_does_not_hold_a_group_back() {
    // Fair queues: a standard queue's messages carry a MessageGroupId too.
    let grouped = |id: &str, body: &str| {
        let mut message = message(id, body, None);
        message.event_source_arn = Some("arn:aws:sqs:eu-west-1:123456789012:orders".into());
        message
            .attributes
            .insert("MessageGroupId".into(), "tenant-1".into());
        message
    };
    let sqs = SqsBatch::new(Engine::builder(MemoryStore::new()).build(), "fair");
    let (seen, handler) = recorder();
    let response = sqs
        .process(
            batch(vec![grouped("m1", "fail-1"), grouped("m2", "ok-2")]),
            &handler,
        )
        .await
        .expect("a response");
    assert_eq!(failed_ids(&response), ["m1"], "m2 is not held back");
    assert!(seen.lock().unwrap().contains(&"ok-2".to_string()));
}

#[tokio::test]
async fn fail_on_entire_batch_failure_fails_the_invocation_only_when_nothing_completed() {
    let engine = Engine::builder(MemoryStore::new()).build();
    let (_, handler) = recorder();
    let all_fail = || {
        batch(vec![
            message("m1", "fail-1", None),
            message("m2", "fail-2", None),
        ])
    };

    // Off by default: every record named in a partial response.
    let default = SqsBatch::new(engine.clone(), "default");
    let response = default.process(all_fail(), &handler).await;
    let response = response.expect("a partial response by default");
    assert_eq!(failed_ids(&response), ["m1", "m2"]);

    let strict = SqsBatch::new(engine.clone(), "strict").fail_on_entire_batch_failure();
    let failure = strict
        .process(all_fail(), &handler)
        .await
        .expect_err("nothing completed: the invocation fails");
    assert_eq!(failure.report().count(RecordStatus::Failed), 2);

    // One record completed: the partial response, as without the option.
    let response = strict
        .process(
            batch(vec![
                message("m3", "ok-3", None),
                message("m4", "fail-4", None),
            ]),
            &handler,
        )
        .await
        .expect("a partial response");
    assert_eq!(failed_ids(&response), ["m4"]);

    // A FIFO group held back behind its first failure completed nothing
    // either.
    let held = strict
        .process(
            batch(vec![
                message("f1", "fail-f1", Some("G")),
                message("f2", "ok-f2", Some("G")),
            ]),
            &handler,
        )
        .await
        .expect_err("nothing completed");
    assert_eq!(held.report().count(RecordStatus::HeldBack), 1);
}

#[tokio::test]
async fn a_fingerprint_of_selected_fields_lets_a_resent_message_replay() {
    let order = |body: &str| {
        serde_json::from_str::<serde_json::Value>(body).ok()?["order"]
            .as_str()
            .map(str::to_owned)
    };
    let resent = || {
        batch(vec![
            message(
                "m1",
                r#"{"order":"o-1","amount":5,"sent_at":"10:00"}"#,
                None,
            ),
            message(
                "m2",
                r#"{"order":"o-1","amount":5,"sent_at":"10:05"}"#,
                None,
            ),
        ])
    };
    // The whole body counts by default: the producer's second send, with
    // its new timestamp, reuses the key with another payload and fails.
    let whole = SqsBatch::new(Engine::builder(MemoryStore::new()).build(), "orders")
        .key(move |m: &SqsMessage| order(m.body.as_deref()?))
        .concurrency(1);
    let (seen, handler) = recorder();
    let response = whole.process(resent(), &handler).await.expect("a response");
    assert_eq!(failed_ids(&response), ["m2"]);
    assert_eq!(seen.lock().unwrap().len(), 1);

    let selected = [
        crate::JsonPointer::new("/order").unwrap(),
        crate::JsonPointer::new("/amount").unwrap(),
    ];
    let narrowed = SqsBatch::new(Engine::builder(MemoryStore::new()).build(), "orders")
        .key(move |m: &SqsMessage| order(m.body.as_deref()?))
        .fingerprint(move |m: &SqsMessage| {
            Fingerprint::of_json_pointers(m.body.as_deref().unwrap_or("").as_bytes(), &selected)
        })
        .concurrency(1);
    let (seen, handler) = recorder();
    let response = narrowed
        .process(resent(), &handler)
        .await
        .expect("a response");
    assert!(response.batch_item_failures.is_empty(), "{response:?}");
    assert_eq!(seen.lock().unwrap().len(), 1, "the second send replayed");
}

/// Issue 41, item 3: a record whose key was used with another payload, or
/// that has no key, is delivered again by default (its FIFO group held up
/// behind it); given up as final (`Unprocessable::Final`), it is reported
/// done with an ERROR line and a metric, and its group goes on.
#[tokio::test]
async fn unprocessable_records_are_redelivered_or_given_up_as_final() {
    // The key is the body's part before ':'; the fingerprint, its whole body.
    let key = |message: &SqsMessage| {
        let body = message.body.as_deref()?;
        body.split_once(':').map(|(key, _)| key.to_owned())
    };
    let event = || {
        batch(vec![
            message("a1", "k1:charge 10", Some("A")),
            message("a2", "k1:charge 99", Some("A")),
            message("a3", "k3:charge 30", Some("A")),
            message("b1", "no key here", Some("B")),
            message("b2", "k5:charge 50", Some("B")),
        ])
    };
    for unprocessable in [Unprocessable::Redeliver, Unprocessable::Final] {
        let lines = Arc::new(Mutex::new(Vec::<String>::new()));
        let written = Arc::clone(&lines);
        let sqs = SqsBatch::new(Engine::builder(MemoryStore::new()).build(), "fifo")
            .key(key)
            .unprocessable(unprocessable)
            .metrics(
                EmfMetrics::new("orders")
                    .with_writer(move |line| written.lock().unwrap().push(line.to_owned())),
            );
        let (seen, handler) = recorder();
        let response = sqs.process(event(), &handler).await.expect("a response");
        let mut failed = failed_ids(&response);
        failed.sort();
        let lines = lines.lock().unwrap();
        match unprocessable {
            Unprocessable::Redeliver => {
                assert_eq!(failed, ["a2", "a3", "b1", "b2"], "held up behind them");
                assert_eq!(*seen.lock().unwrap(), ["k1:charge 10"]);
                assert!(lines.is_empty(), "{lines:?}");
            }
            _ => {
                assert!(failed.is_empty(), "{failed:?}");
                let mut ran = seen.lock().unwrap().clone();
                ran.sort();
                assert_eq!(ran, ["k1:charge 10", "k3:charge 30", "k5:charge 50"]);
                let mut reasons: Vec<String> = lines
                    .iter()
                    .map(|line| {
                        let value: serde_json::Value = serde_json::from_str(line).unwrap();
                        assert_eq!(value["UnprocessableRecords"], 1, "{line}");
                        value["Reason"].as_str().unwrap().to_owned()
                    })
                    .collect();
                reasons.sort();
                assert_eq!(reasons, ["key_missing", "key_reused"]);
            }
        }
    }
}

/// A batch's redaction: the record keeps each result without the fields
/// named, and a redelivered message replays (its result is never run
/// again).
#[tokio::test]
async fn a_batch_stores_each_result_redacted() {
    let store = MemoryStore::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let sqs = SqsBatch::new(Engine::builder(store.clone()).build(), "queue")
        .key(|m: &SqsMessage| m.body.clone())
        .redact_json(
            crate::JsonRedaction::new().replace(crate::JsonPointer::new("/card").unwrap(), "****"),
        );
    let handler = |message: SqsMessage| {
        runs.fetch_add(1, Ordering::SeqCst);
        async move {
            Ok::<_, String>(
                serde_json::json!({ "order": message.body, "card": "4242424242424242" }),
            )
        }
    };
    for id in ["m1", "m2"] {
        let response = sqs
            .process(batch(vec![message(id, "a", None)]), handler)
            .await
            .expect("a partial batch response");
        assert!(response.batch_item_failures.is_empty(), "{response:?}");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the redelivery replayed");
    let stored = store.records().pop().unwrap().response.unwrap();
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&stored).unwrap(),
        serde_json::json!({ "order": "a", "card": "****" })
    );
}

/// Each record's answer reaches the engine's observers through the batch
/// port.
#[tokio::test]
async fn each_record_is_reported_through_the_batch_port() {
    let observer = crate::testing::RecordingObserver::default();
    let engine = Engine::builder(MemoryStore::new())
        .observer(observer.clone())
        .build();
    let sqs = SqsBatch::new(engine, "queue").key(|m: &SqsMessage| m.body.clone());
    let (_, handler) = recorder();
    sqs.process(
        batch(vec![message("m1", "a", None), message("m2", "a", None)]),
        &handler,
    )
    .await
    .expect("a partial batch response");
    let mut answers = observer.answers_through(crate::observe::Port::Batch);
    answers.sort_unstable();
    assert_eq!(answers, ["fresh", "replay"]);
}

/// A record whose handler fails after a step (recovery points, reached
/// through `ClaimHandle::current()`) is reported failed; its redelivery
/// takes the record over and resumes after the step instead of running
/// it again.
#[tokio::test]
async fn a_redelivered_record_resumes_after_its_recorded_step() {
    let sqs = SqsBatch::new(Engine::builder(MemoryStore::new()).build(), "queue");
    let charges = Arc::new(AtomicUsize::new(0));
    let calls = Arc::new(AtomicUsize::new(0));
    let handler = {
        let (charges, calls) = (Arc::clone(&charges), Arc::clone(&calls));
        move |_message: SqsMessage| {
            let (charges, calls) = (Arc::clone(&charges), Arc::clone(&calls));
            async move {
                let call = calls.fetch_add(1, Ordering::SeqCst) + 1;
                let claim = ClaimHandle::current().expect("inside the record's run");
                let charge = claim
                    .step("charge", || async {
                        Ok::<_, String>(charges.fetch_add(1, Ordering::SeqCst) + 1)
                    })
                    .await
                    .map_err(|error| format!("{error:?}"))?;
                if call == 1 {
                    return Err("the ledger is down".to_owned());
                }
                Ok(charge)
            }
        }
    };
    for failed in [vec!["m1"], vec![]] {
        let response = sqs
            .process(batch(vec![message("m1", "order-77", None)]), &handler)
            .await
            .expect("a partial batch response");
        assert_eq!(failed_ids(&response), failed);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2, "redelivered once");
    assert_eq!(charges.load(Ordering::SeqCst), 1, "charged once");
}
