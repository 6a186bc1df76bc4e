"""Powertools for AWS Lambda (Python): one scenario of the cost benchmark
(make bench-cost), the same requests as `bench_driver cost`.

Environment: BENCH_ENDPOINT (the recording proxy), BENCH_TABLE, BENCH_N,
BENCH_COST_SCENARIO (new, replay, cached, in-progress, mismatch),
BENCH_RESPONSE_BYTES, BENCH_T0. Each measured request is framed by two
marks sent to the proxy. Payload validation is on (the crate always
checks the payload), so a changed payload is refused, as the crate's 422.
Prints one JSON line.
"""
import json
import os
import threading
import urllib.request

import boto3
from aws_lambda_powertools.utilities.idempotency import (
    DynamoDBPersistenceLayer,
    IdempotencyConfig,
    idempotent_function,
)

ENDPOINT = os.environ["BENCH_ENDPOINT"]
SCENARIO = os.environ["BENCH_COST_SCENARIO"]
N = int(os.environ["BENCH_N"])
BYTES = int(os.environ["BENCH_RESPONSE_BYTES"])
RUN = os.environ["BENCH_T0"]


def hex_padding(length):
    seed, out = 7, []
    for _ in range(length):
        seed = (seed * 1103515245 + 12345) % 2147483648
        out.append("0123456789abcdef"[(seed >> 16) & 15])
    return "".join(out)


PADDING = hex_padding(BYTES)
HOLD = {}

client = boto3.client("dynamodb", endpoint_url=ENDPOINT, region_name="us-east-1",
                      aws_access_key_id="local", aws_secret_access_key="local")
persistence = DynamoDBPersistenceLayer(table_name=os.environ["BENCH_TABLE"], boto3_client=client)
config = IdempotencyConfig(event_key_jmespath="order_id", raise_on_no_idempotency_key=True,
                           payload_validation_jmespath="[amount, currency, customer]",
                           use_local_cache=SCENARIO == "cached", local_cache_max_items=4096)


@idempotent_function(data_keyword_argument="order", persistence_store=persistence, config=config)
def charge(order):
    hold = HOLD.get(order["order_id"])
    if hold:
        hold["entered"].set()
        hold["release"].wait()
    result = {"id": "ch_" + order["order_id"], "amount": order["amount"], "currency": order["currency"],
              "receipt": ""}
    bare = len(json.dumps(result, separators=(",", ":")))
    result["receipt"] = PADDING[:max(0, BYTES - bare)]
    return result


def order(key, amount=1250):
    return {"order_id": key, "amount": amount, "currency": "EUR", "customer": "cus_42"}


def mark(label):
    urllib.request.urlopen(f"{ENDPOINT}/__mark/{label}").read()


def main():
    outcomes = {}
    for i in range(N):
        key = f"{SCENARIO}-{i}-{RUN}"
        first = None
        if SCENARIO in ("replay", "cached", "mismatch"):
            charge(order=order(key))
        elif SCENARIO == "in-progress":
            HOLD[key] = {"entered": threading.Event(), "release": threading.Event()}
            first = threading.Thread(target=lambda: charge(order=order(key)))
            first.start()
            HOLD[key]["entered"].wait()
        mark("start")
        try:
            charge(order=order(key, 1251 if SCENARIO == "mismatch" else 1250))
            label = {"new": "fresh", "replay": "replay", "cached": "cached_replay"}.get(SCENARIO, "ok")
        except Exception as error:  # IdempotencyAlreadyInProgressError, IdempotencyValidationError
            label = type(error).__name__
        mark("end")
        outcomes[label] = outcomes.get(label, 0) + 1
        if first:
            HOLD[key]["release"].set()
            first.join()
    print(json.dumps({"impl": "powertools-python", "scenario": SCENARIO, "requests": N,
                      "response_bytes": BYTES, "outcomes": outcomes}))


main()
