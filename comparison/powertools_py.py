"""Powertools for AWS Lambda (Python): the same workload as the other drivers.

Environment: BENCH_T0 (ns, spawn time), BENCH_ENDPOINT, BENCH_TABLE,
BENCH_N (sequential calls), BENCH_CONCURRENT (requests), BENCH_CLIENTS.
With BENCH_REDIS_URL, the records go to that redis-server through
Powertools' RedisCachePersistenceLayer instead of DynamoDB, and the calls
counted are Redis commands. Prints one JSON line of results.
"""
import os
import time

T0 = int(os.environ["BENCH_T0"])

import json  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402

import boto3  # noqa: E402
from aws_lambda_powertools.utilities.idempotency import (  # noqa: E402
    DynamoDBPersistenceLayer,
    IdempotencyConfig,
    idempotent_function,
)

calls = [0]
REDIS_URL = os.environ.get("BENCH_REDIS_URL")


def count(**_):
    calls[0] += 1


if REDIS_URL:
    import redis  # noqa: E402
    from aws_lambda_powertools.utilities.idempotency.persistence.redis import (  # noqa: E402
        RedisCachePersistenceLayer,
    )

    class CountingRedis(redis.Redis):
        def execute_command(self, *args, **options):
            count()
            return super().execute_command(*args, **options)

    persistence = RedisCachePersistenceLayer(client=CountingRedis.from_url(REDIS_URL))
    IMPL = "powertools-python (Redis)"
else:
    client = boto3.client(
        "dynamodb",
        endpoint_url=os.environ["BENCH_ENDPOINT"],
        region_name="us-east-1",
        aws_access_key_id="local",
        aws_secret_access_key="local",
    )
    client.meta.events.register("before-call.dynamodb", count)
    persistence = DynamoDBPersistenceLayer(table_name=os.environ["BENCH_TABLE"], boto3_client=client)
    IMPL = "powertools-python"
config = IdempotencyConfig(event_key_jmespath="order_id", raise_on_no_idempotency_key=True)


@idempotent_function(data_keyword_argument="order", persistence_store=persistence, config=config)
def charge(order):
    return {"id": "ch_" + order["order_id"], "amount": order["amount"], "currency": order["currency"]}


def order(key):
    return {"order_id": key, "amount": 1250, "currency": "EUR", "customer": "cus_42"}


def timed(fn):
    start = time.perf_counter_ns()
    fn()
    return (time.perf_counter_ns() - start) / 1e6


def summary(latencies, wall_s, calls_made, requests):
    latencies = sorted(latencies)
    return {
        "median_ms": statistics.median(latencies),
        "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        "throughput_rps": requests / wall_s,
        "calls_per_request": calls_made / requests,
    }


def main():
    n = int(os.environ["BENCH_N"])
    charge(order=order("cold"))
    cold_ms = (time.time_ns() - T0) / 1e6
    results = {}

    keys = [f"py-new-{T0}-{i}" for i in range(n)]
    before, start = calls[0], time.perf_counter()
    lat = [timed(lambda k=k: charge(order=order(k))) for k in keys]
    results["new"] = summary(lat, time.perf_counter() - start, calls[0] - before, n)

    before, start = calls[0], time.perf_counter()
    lat = [timed(lambda k=k: charge(order=order(k))) for k in keys]
    results["replay"] = summary(lat, time.perf_counter() - start, calls[0] - before, n)

    total, clients = int(os.environ["BENCH_CONCURRENT"]), int(os.environ["BENCH_CLIENTS"])
    rng = random.Random(7)
    issued = []
    for i in range(total):
        issued.append(rng.choice(issued) if issued and rng.random() < 0.10 else f"py-conc-{T0}-{i}")

    def one(key):
        try:
            return timed(lambda: charge(order=order(key)))
        except Exception:  # IdempotencyAlreadyInProgressError: a duplicate in flight
            return None

    before, start = calls[0], time.perf_counter()
    with ThreadPoolExecutor(max_workers=clients) as pool:
        lat = [x for x in pool.map(one, issued) if x is not None]
    results["concurrent"] = summary(lat, time.perf_counter() - start, calls[0] - before, total)
    results["concurrent"]["errors"] = total - len(lat)
    print(json.dumps({"impl": IMPL, "cold_start_ms": cold_ms, "results": results}))


main()
