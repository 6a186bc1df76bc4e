"""Has Powertools (Python) write idempotency records through its own
handlers, for the compatibility test (tests/powertools_compat.rs).

    write_records.py MANIFEST.json

For each handler (header key, body-field key, SQS messageId), one request
of each state: completed (the handler ran), in progress (the process was
killed inside the handler), expired (completed with a one-second expiry,
then waited out) and absent (never sent). Then the edge cases, completed:
payloads only Python reads as it does (`-0`, integers past 64 bits, lone
surrogates, deep nesting, NaN), a body delivered base64-encoded and keyed
as delivered, an HTTP API handler returning a plain dict and one returning a plain
string, and a request
without the Rust function's key header. The manifest holds the events,
the responses Powertools returned, what it answered to a retry of a
completed request, and the record ids it computed.
"""

import base64
import copy
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)


class Context:
    """The part of the Lambda context Powertools reads."""

    function_name = os.environ.get("AWS_LAMBDA_FUNCTION_NAME", "")
    aws_request_id = "00000000-0000-0000-0000-000000000000"

    def get_remaining_time_in_millis(self):
        return 600_000


def http_event(key, order_id, amount):
    with open(os.path.join(ROOT, "events", "rest-api-create-charge.json")) as f:
        event = json.load(f)
    event["headers"]["Idempotency-Key"] = key
    event["multiValueHeaders"]["Idempotency-Key"] = [key]
    event["body"] = json.dumps({"order_id": order_id, "amount": amount, "currency": "eur"})
    return event


def http_api_event(body):
    with open(os.path.join(ROOT, "events", "http-api-create-charge.json")) as f:
        event = json.load(f)
    event["body"] = body
    return event


def edge_cases():
    """(name, handler, event): requests Powertools completes, whose retries
    the Rust function must replay without running its handler."""
    nested = "[" * 150 + "]" * 150
    cases = [
        ("minus_zero_key", "body", '{"order_id": -0, "amount": 1}'),
        ("big_int_key", "body", '{"order_id": 123456789012345678901234567890, "amount": 1}'),
        ("lone_surrogate_key", "body", '{"order_id": "a\\ud800b", "amount": 1}'),
        ("nested_150_key", "body", '{"order_id": ' + nested + ', "amount": 1}'),
        ("nan_key", "body", '{"order_id": NaN, "amount": 1}'),
        ("minus_zero_validation", "header", '{"order_id": "o-mz", "amount": -0}'),
        ("lone_surrogate_validation", "header", '{"order_id": "o-ls", "amount": 1, "memo": "\\udc00"}'),
    ]
    events = []
    for name, handler, body in cases:
        event = http_event(f"pt-edge-{name}", "unused", 0)
        event["body"] = body
        events.append((name, handler, event))
    encoded = http_event("pt-edge-base64", "o-b64", 7)
    encoded["body"] = base64.b64encode(b'{"order_id": "o-b64", "amount": 7, "note": "\xc3\xa9"}').decode()
    encoded["isBase64Encoded"] = True
    events.append(("base64_body_raw_key", "raw", encoded))
    plain = http_api_event('{"order_id": "o-plain", "amount": 5}')
    plain["headers"]["idempotency-key"] = "pt-edge-plain"
    events.append(("plain_dict_http_api", "plain", plain))
    text = http_api_event('{"order_id": "o-text", "amount": 6}')
    text["headers"]["idempotency-key"] = "pt-edge-text"
    events.append(("plain_string_http_api", "text", text))
    keyless = http_event("unused", "o-keyless", 9)
    del keyless["headers"]["Idempotency-Key"]
    del keyless["multiValueHeaders"]["Idempotency-Key"]
    events.append(("no_key_header", "body", keyless))
    return events


def sqs_event(message_ids):
    with open(os.path.join(ROOT, "events", "sqs-receipts-batch-with-duplicates.json")) as f:
        template = json.load(f)["Records"][0]
    records = []
    for i, message_id in enumerate(message_ids):
        record = copy.deepcopy(template)
        record["messageId"] = message_id
        record["body"] = json.dumps({"charge_id": f"ch_{i}", "email": "ana@example.com"})
        records.append(record)
    return {"Records": records}


def run_elsewhere(handler, event, **env):
    """Runs a handler in a process of its own (to kill it, or to give it
    another expiry); returns its exit status."""
    code = (
        "import json, sys, write_records, app; "
        "event = json.loads(sys.stdin.read()); "
        f"app.HANDLERS[{handler!r}](event, write_records.Context())"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps(event),
        text=True,
        cwd=HERE,
        env={**os.environ, **env},
        check=False,
    )
    return done.returncode


def main():
    import app
    from aws_lambda_powertools.utilities.idempotency.exceptions import IdempotencyValidationError

    manifest = {"http": [], "sqs": {}}
    last_expiring = time.time()
    ids = {
        "completed": "pt-completed",
        "in_progress": "pt-in-progress",
        "expired": "pt-expired",
        "absent": "pt-absent",
    }
    for handler in ("header", "body"):
        for state, key in ids.items():
            order_id = f"{handler}-{state}"
            event = http_event(f"{key}-{handler}", order_id, 1250)
            case = {"handler": handler, "state": state, "event": event}
            if state == "completed":
                case["response"] = app.HANDLERS[handler](event, Context())
                # What Powertools itself answers to the client's retry: the
                # Rust function must answer the same.
                try:
                    again = app.HANDLERS[handler](event, Context())
                    assert again == case["response"], "Powertools replayed another response"
                    case["powertools_retry"] = "replayed"
                except IdempotencyValidationError:
                    case["powertools_retry"] = "validation_error"
            elif state == "in_progress":
                status = run_elsewhere(handler, event, PT_DIE_IN_HANDLER="1")
                assert status == 17, f"the killed handler exited {status}"
            elif state == "expired":
                status = run_elsewhere(handler, event, PT_EXPIRES_AFTER="1")
                assert status == 0, f"the expiring handler exited {status}"
                last_expiring = time.time()
            case["powertools_id"] = app.STORES[handler]._get_hashed_idempotency_key(data=event)
            manifest["http"].append(case)

    manifest["edge"] = []
    for name, handler, event in edge_cases():
        response = app.HANDLERS[handler](event, Context())
        try:
            again = app.HANDLERS[handler](event, Context())
            assert again == response, f"{name}: Powertools replayed another response"
            retry = "replayed"
        except IdempotencyValidationError:
            # Its Redis layer drops the validation hash on completion.
            retry = "validation_error"
        manifest["edge"].append(
            {
                "name": name,
                "handler": handler,
                "event": event,
                "response": response,
                "powertools_retry": retry,
                "powertools_id": app.STORES[handler]._get_hashed_idempotency_key(data=event),
            }
        )

    message_ids = {state: f"msg-{state}" for state in ids}
    event = sqs_event(list(message_ids.values()))
    by_id = {r["messageId"]: r for r in event["Records"]}
    app.sqs_handler({"Records": [by_id["msg-completed"]]}, Context())
    assert run_elsewhere("sqs", {"Records": [by_id["msg-in_progress"]]}, PT_DIE_IN_HANDLER="1") == 17
    assert run_elsewhere("sqs", {"Records": [by_id["msg-expired"]]}, PT_EXPIRES_AFTER="1") == 0
    last_expiring = time.time()
    manifest["sqs"] = {
        "event": event,
        "states": {message_id: state for state, message_id in message_ids.items()},
        "powertools_ids": {
            r["messageId"]: app.sqs_store._get_hashed_idempotency_key(data=r) for r in event["Records"]
        },
    }

    # In progress without in_progress_expiration (no Lambda context was
    # registered), the process killed inside the handler: an HTTP request
    # and an SQS record.
    manifest["unleased"] = []
    unleased = http_event("pt-unleased-http", "o-unleased", 3)
    assert run_elsewhere("unleased", unleased, PT_DIE_IN_HANDLER="1") == 17
    # Configured here as IdempotencyHandler configures it in the killed
    # process, to compute the same id.
    app.unleased_store.configure(app.unleased_config, "app.charge_unleased")
    manifest["unleased"].append(
        {
            "surface": "http",
            "event": unleased,
            "powertools_id": app.STORES["unleased"]._get_hashed_idempotency_key(data=unleased),
        }
    )
    unleased_sqs = sqs_event(["msg-unleased"])
    assert run_elsewhere("sqs_unleased", unleased_sqs, PT_DIE_IN_HANDLER="1") == 17
    record = unleased_sqs["Records"][0]
    manifest["unleased"].append(
        {
            "surface": "sqs",
            "event": unleased_sqs,
            "powertools_id": app.sqs_store._get_hashed_idempotency_key(data=record),
        }
    )

    # Keyed on queryStringParameters.order, completed: a REST API event
    # (repeated name: API Gateway keeps the last value in
    # queryStringParameters) and an HTTP API one (values joined by commas).
    manifest["query"] = []
    rest = http_event("pt-query-rest", "o-q", 1)
    rest["queryStringParameters"] = {"order": "q-2", "note": "a b"}
    rest["multiValueQueryStringParameters"] = {"order": ["q-1", "q-2"], "note": ["a b"]}
    v2 = http_api_event('{"order_id": "o-q2", "amount": 1}')
    v2["headers"]["idempotency-key"] = "pt-query-v2"
    v2["rawQueryString"] = "order=q-3&note=a%20b&order=q-4"
    v2["queryStringParameters"] = {"order": "q-3,q-4", "note": "a b"}
    for name, event in (("rest", rest), ("http_api", v2)):
        response = app.HANDLERS["query"](event, Context())
        assert app.HANDLERS["query"](event, Context()) == response, "Powertools replayed another response"
        manifest["query"].append(
            {
                "name": name,
                "event": event,
                "response": response,
                "powertools_id": app.STORES["query"]._get_hashed_idempotency_key(data=event),
            }
        )

    # A record written with expires_after_seconds=1 expires once the clock's
    # second passes expiration (DataRecord.is_expired): at most 2 s.
    time.sleep(max(0.0, last_expiring + 2.1 - time.time()))
    with open(sys.argv[1], "w") as f:
        json.dump(manifest, f, indent=1)


if __name__ == "__main__":
    main()
