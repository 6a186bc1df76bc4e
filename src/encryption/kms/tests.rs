//! KmsKeys against the SDK's mocks: every KMS error mapped to the kind the
//! engine reads, answers that do not make a key refused without a panic,
//! data keys reused within their bounds, and a refused key through the
//! engine. (Against a real KMS API: `tests/kms.rs`, on moto.)

use super::*;
use crate::{
    encryption::{key_id_of, KeyProvider},
    testing::ManualClock,
    Attempt, Engine, ErrorKind, Fingerprint, MemoryStore,
};
use aws_sdk_kms::{
    config::{retry::RetryConfig, timeout::TimeoutConfig, BehaviorVersion, Credentials, Region},
    operation::{
        decrypt::{DecryptError, DecryptOutput},
        generate_data_key::{GenerateDataKeyError, GenerateDataKeyOutput},
    },
    types::error::{
        DependencyTimeoutException, DisabledException, IncorrectKeyException,
        InvalidCiphertextException, InvalidKeyUsageException, KeyUnavailableException,
        KmsInternalException, KmsInvalidStateException, NotFoundException,
    },
};
use aws_smithy_mocks::{mock, mock_client, Rule, RuleMode};
use aws_smithy_types::body::SdkBody;
use std::sync::atomic::{AtomicUsize, Ordering};

const KEY: &str = "arn:aws:kms:us-east-1:111122223333:key/11111111-1111-1111-1111-111111111111";
const OLD: &str = "arn:aws:kms:us-east-1:111122223333:key/00000000-0000-0000-0000-000000000000";
const CONTEXT: &str = "tests/kms";

fn client(rules: &[&Rule]) -> Client {
    mock_client!(aws_sdk_kms, RuleMode::MatchAny, rules, |config| config
        .retry_config(RetryConfig::disabled()))
}

fn keys(rules: &[&Rule]) -> KmsKeys {
    KmsKeys::builder(client(rules), KEY, CONTEXT)
        .with_key(OLD)
        .build()
        .unwrap()
}

/// A wrapped key as a stand-in for KMS's ciphertext blob: the plaintext
/// key byte, so that Decrypt's mock can answer the key it wrapped.
fn generated(byte: u8) -> GenerateDataKeyOutput {
    GenerateDataKeyOutput::builder()
        .key_id(KEY)
        .plaintext(Blob::new(vec![byte; 32]))
        .ciphertext_blob(Blob::new(vec![byte; 40]))
        .build()
}

fn generate_ok() -> Rule {
    let n = AtomicUsize::new(0);
    mock!(Client::generate_data_key)
        .match_requests(|request| {
            request.key_id() == Some(KEY)
                && request.key_spec() == Some(&DataKeySpec::Aes256)
                && request
                    .encryption_context()
                    .and_then(|c| c.get(ENCRYPTION_CONTEXT_KEY))
                    == Some(&CONTEXT.to_owned())
        })
        .then_compute_output(move |_| generated(n.fetch_add(1, Ordering::SeqCst) as u8 + 1))
}

fn decrypt_ok() -> Rule {
    mock!(Client::decrypt)
        .match_requests(|request| {
            request
                .encryption_context()
                .and_then(|c| c.get(ENCRYPTION_CONTEXT_KEY))
                == Some(&CONTEXT.to_owned())
        })
        .then_compute_output(|request| {
            let wrapped = request.ciphertext_blob().unwrap().as_ref();
            DecryptOutput::builder()
                .key_id(request.key_id().unwrap())
                .plaintext(Blob::new(vec![wrapped[0]; 32]))
                .build()
        })
}

fn generate_error(error: fn() -> GenerateDataKeyError) -> Rule {
    mock!(Client::generate_data_key).then_error(error)
}

fn decrypt_error(error: fn() -> DecryptError) -> Rule {
    mock!(Client::decrypt).then_error(error)
}

/// A raw HTTP answer of `status` with KMS's JSON error body for `code`.
fn http_answer(
    status: u16,
    code: &'static str,
) -> impl Fn() -> aws_sdk_kms::config::http::HttpResponse + Send + Sync + 'static {
    move || {
        let body = format!(r#"{{"__type":"{code}","message":"from the test"}}"#);
        aws_sdk_kms::config::http::HttpResponse::new(
            status.try_into().unwrap(),
            SdkBody::from(body),
        )
    }
}

/// What a case is, the error KMS answers, and the kind it maps to.
type ErrorCase<E> = (&'static str, fn() -> E, KeyErrorKind);

/// What a case is, and the answer KMS gives.
type Answer<O> = (&'static str, fn() -> O);

async fn seal_kind(rules: &[&Rule]) -> KeyErrorKind {
    keys(rules)
        .sealing_key()
        .resolve()
        .await
        .expect_err("no key")
        .kind()
}

async fn open_kind(rules: &[&Rule]) -> KeyErrorKind {
    keys(rules)
        .opening_key(KEY, &[7; 40])
        .resolve()
        .await
        .expect_err("no key")
        .kind()
}

#[tokio::test]
async fn every_kms_error_of_generate_data_key_maps_to_its_kind() {
    use KeyErrorKind::*;
    let cases: [ErrorCase<GenerateDataKeyError>; 8] = [
        (
            "internal",
            || GenerateDataKeyError::KmsInternalException(KmsInternalException::builder().build()),
            Unavailable,
        ),
        (
            "dependency timeout",
            || {
                GenerateDataKeyError::DependencyTimeoutException(
                    DependencyTimeoutException::builder().build(),
                )
            },
            Unavailable,
        ),
        (
            "key unavailable",
            || {
                GenerateDataKeyError::KeyUnavailableException(
                    KeyUnavailableException::builder().build(),
                )
            },
            Unavailable,
        ),
        (
            "not found",
            || GenerateDataKeyError::NotFoundException(NotFoundException::builder().build()),
            UnknownKey,
        ),
        (
            "disabled",
            || GenerateDataKeyError::DisabledException(DisabledException::builder().build()),
            UnknownKey,
        ),
        (
            "pending deletion",
            || {
                GenerateDataKeyError::KmsInvalidStateException(
                    KmsInvalidStateException::builder().build(),
                )
            },
            UnknownKey,
        ),
        (
            "key usage",
            || {
                GenerateDataKeyError::InvalidKeyUsageException(
                    InvalidKeyUsageException::builder().build(),
                )
            },
            UnknownKey,
        ),
        (
            "unmodelled",
            || GenerateDataKeyError::unhandled("something new"),
            Other,
        ),
    ];
    for (what, error, kind) in cases {
        assert_eq!(seal_kind(&[&generate_error(error)]).await, kind, "{what}");
    }
}

#[tokio::test]
async fn every_kms_error_of_decrypt_maps_to_its_kind() {
    use KeyErrorKind::*;
    let cases: [ErrorCase<DecryptError>; 10] = [
        (
            "internal",
            || DecryptError::KmsInternalException(KmsInternalException::builder().build()),
            Unavailable,
        ),
        (
            "dependency timeout",
            || {
                DecryptError::DependencyTimeoutException(
                    DependencyTimeoutException::builder().build(),
                )
            },
            Unavailable,
        ),
        (
            "key unavailable",
            || DecryptError::KeyUnavailableException(KeyUnavailableException::builder().build()),
            Unavailable,
        ),
        (
            "invalid ciphertext",
            || {
                DecryptError::InvalidCiphertextException(
                    InvalidCiphertextException::builder().build(),
                )
            },
            Invalid,
        ),
        (
            "incorrect key",
            || DecryptError::IncorrectKeyException(IncorrectKeyException::builder().build()),
            Invalid,
        ),
        (
            "not found",
            || DecryptError::NotFoundException(NotFoundException::builder().build()),
            UnknownKey,
        ),
        (
            "disabled",
            || DecryptError::DisabledException(DisabledException::builder().build()),
            UnknownKey,
        ),
        (
            "pending deletion",
            || DecryptError::KmsInvalidStateException(KmsInvalidStateException::builder().build()),
            UnknownKey,
        ),
        (
            "key usage",
            || DecryptError::InvalidKeyUsageException(InvalidKeyUsageException::builder().build()),
            UnknownKey,
        ),
        (
            "unmodelled",
            || DecryptError::unhandled("something new"),
            Other,
        ),
    ];
    for (what, error, kind) in cases {
        assert_eq!(open_kind(&[&decrypt_error(error)]).await, kind, "{what}");
    }
    // AccessDeniedException is not modelled: its code is.
    let denied = || {
        DecryptError::generic(
            aws_sdk_kms::error::ErrorMetadata::builder()
                .code("AccessDeniedException")
                .build(),
        )
    };
    assert_eq!(open_kind(&[&decrypt_error(denied)]).await, UnknownKey);
}

/// Errors KMS answers on the wire that the model does not name: throttling
/// (what the SDK's retries leave), 5xx without a code, an expired token,
/// an unknown 4xx; and answers that are not KMS's at all.
#[tokio::test]
async fn wire_answers_map_to_an_outage_or_a_refusal() {
    use KeyErrorKind::*;
    let cases: [(u16, &'static str, KeyErrorKind); 8] = [
        (400, "ThrottlingException", Unavailable),
        (400, "com.amazonaws.kms#ThrottlingException", Unavailable),
        (400, "ExpiredTokenException", Unavailable),
        (500, "KMSInternalException", Unavailable),
        (503, "SomethingElse", Unavailable),
        (400, "AccessDeniedException", UnknownKey),
        (400, "DisabledException", UnknownKey),
        (400, "SomethingElse", Other),
    ];
    for (status, code, kind) in cases {
        let generate =
            mock!(Client::generate_data_key).then_http_response(http_answer(status, code));
        assert_eq!(
            seal_kind(&[&generate]).await,
            kind,
            "GenerateDataKey {status} {code}"
        );
        let decrypt = mock!(Client::decrypt).then_http_response(http_answer(status, code));
        assert_eq!(
            open_kind(&[&decrypt]).await,
            kind,
            "Decrypt {status} {code}"
        );
    }
    // Not JSON at all (an HTML error page of a proxy): a 502 is an outage.
    let page = || {
        aws_sdk_kms::config::http::HttpResponse::new(
            502.try_into().unwrap(),
            SdkBody::from("<html>bad gateway</html>"),
        )
    };
    let decrypt = mock!(Client::decrypt).then_http_response(page);
    assert_eq!(open_kind(&[&decrypt]).await, Unavailable);
}

/// A KMS that cannot be reached, or does not answer in time, is an outage;
/// a client without credentials is not (no retry makes them appear).
#[tokio::test]
async fn no_connection_and_timeouts_are_an_outage_and_no_credentials_is_not() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed_port = closed.local_addr().unwrap().port();
    drop(closed);
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_port = silent.local_addr().unwrap().port();
    let real = |endpoint: String, credentials: bool| {
        let mut config = aws_sdk_kms::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .endpoint_url(endpoint)
            .retry_config(RetryConfig::disabled())
            .timeout_config(
                TimeoutConfig::builder()
                    .operation_timeout(Duration::from_millis(300))
                    .build(),
            );
        if credentials {
            config = config.credentials_provider(Credentials::for_tests());
        }
        KmsKeys::builder(Client::from_conf(config.build()), KEY, CONTEXT)
            .build()
            .unwrap()
    };
    for (what, endpoint, credentials, kind) in [
        (
            "closed port",
            format!("http://127.0.0.1:{closed_port}"),
            true,
            KeyErrorKind::Unavailable,
        ),
        (
            "no answer",
            format!("http://127.0.0.1:{silent_port}"),
            true,
            KeyErrorKind::Unavailable,
        ),
        (
            "no credentials",
            format!("http://127.0.0.1:{closed_port}"),
            false,
            KeyErrorKind::Other,
        ),
    ] {
        let keys = real(endpoint, credentials);
        let sealed = keys.sealing_key().resolve().await.expect_err(what);
        assert_eq!(sealed.kind(), kind, "{what}: {sealed}");
        let opened = keys
            .opening_key(KEY, &[1; 40])
            .resolve()
            .await
            .expect_err(what);
        assert_eq!(opened.kind(), kind, "{what}: {opened}");
    }
    drop(silent);
}

/// Answers that do not make a data key: refused, never a panic.
#[tokio::test]
async fn answers_that_do_not_make_a_key_are_refused() {
    let cases: [Answer<GenerateDataKeyOutput>; 4] = [
        ("no plaintext", || {
            GenerateDataKeyOutput::builder()
                .key_id(KEY)
                .ciphertext_blob(Blob::new(vec![1; 40]))
                .build()
        }),
        ("no ciphertext", || {
            GenerateDataKeyOutput::builder()
                .key_id(KEY)
                .plaintext(Blob::new(vec![1; 32]))
                .build()
        }),
        ("a 16-byte key", || {
            GenerateDataKeyOutput::builder()
                .key_id(KEY)
                .plaintext(Blob::new(vec![1; 16]))
                .ciphertext_blob(Blob::new(vec![1; 40]))
                .build()
        }),
        ("a wrapped key too long", || {
            GenerateDataKeyOutput::builder()
                .key_id(KEY)
                .plaintext(Blob::new(vec![1; 32]))
                .ciphertext_blob(Blob::new(vec![1; 2000]))
                .build()
        }),
    ];
    for (what, output) in cases {
        let rule = mock!(Client::generate_data_key).then_output(output);
        assert_eq!(seal_kind(&[&rule]).await, KeyErrorKind::Invalid, "{what}");
    }
    let cases: [Answer<DecryptOutput>; 3] = [
        ("no plaintext", || {
            DecryptOutput::builder().key_id(KEY).build()
        }),
        ("a 31-byte key", || {
            DecryptOutput::builder()
                .key_id(KEY)
                .plaintext(Blob::new(vec![1; 31]))
                .build()
        }),
        ("another key used", || {
            DecryptOutput::builder()
                .key_id(OLD)
                .plaintext(Blob::new(vec![1; 32]))
                .build()
        }),
    ];
    for (what, output) in cases {
        let rule = mock!(Client::decrypt).then_output(output);
        assert_eq!(open_kind(&[&rule]).await, KeyErrorKind::Invalid, "{what}");
    }
}

#[tokio::test]
async fn a_record_naming_a_key_not_configured_is_refused_without_a_call() {
    let decrypt = decrypt_ok();
    let keys = keys(&[&decrypt]);
    let other = "arn:aws:kms:us-east-1:111122223333:key/99999999-9999-9999-9999-999999999999";
    for named in [other, "alias/anything", ""] {
        let error = keys
            .opening_key(named, &[1; 40])
            .resolve()
            .await
            .unwrap_err();
        assert_eq!(error.kind(), KeyErrorKind::UnknownKey, "{named}");
    }
    assert_eq!(decrypt.num_calls(), 0);
    // The configured ones open.
    for named in [KEY, OLD] {
        let key = keys.opening_key(named, &[2; 40]).resolve().await.unwrap();
        assert_eq!(key.id(), named);
    }
}

#[tokio::test]
async fn a_data_key_seals_max_records_responses_and_is_then_replaced() {
    let generate = generate_ok();
    let keys = KmsKeys::builder(client(&[&generate]), KEY, CONTEXT)
        .max_records(10)
        .build()
        .unwrap();
    let mut wrapped = Vec::new();
    for _ in 0..25 {
        let key = keys.sealing_key().resolve().await.unwrap();
        assert_eq!(key.id(), KEY);
        wrapped.push(key.wrapped()[0]);
    }
    assert_eq!(generate.num_calls(), 3, "⌈25 / 10⌉");
    assert_eq!(wrapped.iter().filter(|&&w| w == 1).count(), 10);
    assert_eq!(wrapped.iter().filter(|&&w| w == 2).count(), 10);
    assert_eq!(wrapped.iter().filter(|&&w| w == 3).count(), 5);
}

#[tokio::test]
async fn a_data_key_seals_for_max_age_and_unwrapped_keys_are_kept_as_long() {
    let (generate, decrypt) = (generate_ok(), decrypt_ok());
    let keys = KmsKeys::builder(client(&[&generate, &decrypt]), KEY, CONTEXT)
        .max_age(Duration::from_millis(150))
        .build()
        .unwrap();
    let first = keys.sealing_key().resolve().await.unwrap();
    keys.sealing_key().resolve().await.unwrap();
    assert_eq!(generate.num_calls(), 1);
    // The key this process sealed with opens without a call.
    keys.opening_key(KEY, first.wrapped())
        .resolve()
        .await
        .unwrap();
    keys.opening_key(KEY, &[9; 40]).resolve().await.unwrap();
    keys.opening_key(KEY, &[9; 40]).resolve().await.unwrap();
    assert_eq!(
        decrypt.num_calls(),
        1,
        "one Decrypt for a key replayed twice"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let next = keys.sealing_key().resolve().await.unwrap();
    assert_eq!(generate.num_calls(), 2, "past max_age, a new data key");
    assert_ne!(next.wrapped(), first.wrapped());
    keys.opening_key(KEY, &[9; 40]).resolve().await.unwrap();
    assert_eq!(decrypt.num_calls(), 2, "past max_age, asked again");
}

#[tokio::test]
async fn the_unwrapped_cache_keeps_its_capacity() {
    let decrypt = decrypt_ok();
    let keys = KmsKeys::builder(client(&[&decrypt]), KEY, CONTEXT)
        .cache_capacity(2)
        .build()
        .unwrap();
    for byte in [1, 2, 3, 1] {
        keys.opening_key(KEY, &[byte; 40]).resolve().await.unwrap();
    }
    assert_eq!(decrypt.num_calls(), 4, "1 was evicted by 3");
    keys.opening_key(KEY, &[3; 40]).resolve().await.unwrap();
    assert_eq!(decrypt.num_calls(), 4);
}

#[test]
fn settings_that_cannot_work_are_refused() {
    let builder = || KmsKeys::builder(client(&[]), KEY, CONTEXT);
    let invalid = |built: Result<KmsKeys, KeyError>| built.unwrap_err().kind();
    for (what, built) in [
        (
            "an alias as an older key",
            builder().with_key("alias/old").build(),
        ),
        (
            "a key id as an older key",
            builder()
                .with_key("1234abcd-12ab-34cd-56ef-1234567890ab")
                .build(),
        ),
        ("no records", builder().max_records(0).build()),
        (
            "past 2^32 records",
            builder().max_records(MAX_RECORDS_LIMIT + 1).build(),
        ),
        ("no age", builder().max_age(Duration::ZERO).build()),
        ("no cache", builder().cache_capacity(0).build()),
        ("no context", KmsKeys::builder(client(&[]), KEY, "").build()),
        (
            "no primary",
            KmsKeys::builder(client(&[]), "", CONTEXT).build(),
        ),
    ] {
        assert_eq!(invalid(built), KeyErrorKind::Invalid, "{what}");
    }
    // An alias is a primary.
    let keys = KmsKeys::builder(client(&[]), "alias/idempotency", CONTEXT)
        .with_key(OLD)
        .build()
        .unwrap();
    assert_eq!(keys.primary(), "alias/idempotency");
    assert!(format!("{keys:?}").contains("alias/idempotency"));
}

#[test]
fn key_arns_are_told_from_aliases() {
    assert!(is_key_arn(KEY));
    assert!(is_key_arn(
        "arn:aws-cn:kms:cn-north-1:111122223333:key/mrk-1234"
    ));
    for not in [
        "alias/x",
        "arn:aws:kms:us-east-1:111122223333:alias/x",
        "arn:aws:kms:us-east-1:111122223333:key/",
        "arn::kms:us-east-1:111122223333:key/x",
        "arn:aws:s3:us-east-1:111122223333:key/x",
        "1234abcd-12ab-34cd-56ef-1234567890ab",
    ] {
        assert!(!is_key_arn(not), "{not}");
    }
}

/// The primary given as an alias: records name the key ARN KMS reports,
/// and a process that has not sealed learns it before opening one.
#[tokio::test]
async fn an_alias_primary_seals_under_its_key_arn_and_a_fresh_process_opens_it() {
    let (generate, decrypt) = (
        mock!(Client::generate_data_key).then_compute_output(|_| generated(5)),
        decrypt_ok(),
    );
    let keys = KmsKeys::builder(client(&[&generate, &decrypt]), "alias/idempotency", CONTEXT)
        .build()
        .unwrap();
    let opened = keys.opening_key(KEY, &[6; 40]).resolve().await.unwrap();
    assert_eq!(opened.id(), KEY);
    assert_eq!((generate.num_calls(), decrypt.num_calls()), (1, 1));
    // The data key it generated to learn the ARN seals next, no call.
    assert_eq!(keys.sealing_key().resolve().await.unwrap().id(), KEY);
    assert_eq!(generate.num_calls(), 1);
}

/// Through the engine: a record whose KMS key was disabled, or scheduled
/// for deletion, is refused, never replayed and never run again.
#[tokio::test]
async fn a_record_under_a_disabled_key_is_refused_by_the_engine() {
    let store = MemoryStore::new();
    let clock = ManualClock::new(1_700_000_000_000);
    let runs = AtomicUsize::new(0);
    let attempt = Attempt::new("s", "k", Fingerprint::of_bytes(b"payload"));
    let run = || async {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, ()>("4242".to_owned())
    };
    let generate = generate_ok();
    let sealing = keys(&[&generate]);
    let engine = Engine::builder(store.clone())
        .clock(clock.clone())
        .encryption(sealing.encryption())
        .build();
    engine.execute(&attempt, run).await.unwrap();
    let record = store.record(&engine.record_id("s", "k")).unwrap();
    assert_eq!(key_id_of(record.response.as_deref().unwrap()), Some(KEY));
    let refusals: [fn() -> DecryptError; 2] = [
        || DecryptError::DisabledException(DisabledException::builder().build()),
        || DecryptError::KmsInvalidStateException(KmsInvalidStateException::builder().build()),
    ];
    for refusal in refusals {
        let decrypt = decrypt_error(refusal);
        let engine = Engine::builder(store.clone())
            .clock(clock.clone())
            .encryption(keys(&[&decrypt]).encryption())
            .build();
        let answer = engine.execute(&attempt, run).await.unwrap_err();
        assert_eq!(answer.kind(), ErrorKind::UnauthenticRecord);
        assert_eq!(decrypt.num_calls(), 1);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "run once, never again");
    assert_eq!(store.record(&record.id), Some(record), "untouched");
}
