"""A Powertools (Python) function, as a team would have it before moving to
the Rust crate: its records are what the compatibility mode must honour.

Configured from the environment by write_records.py:
PT_TABLE (DynamoDB, with AWS_ENDPOINT_URL_DYNAMODB) or PT_REDIS_URL;
PT_EXPIRES_AFTER (seconds, default 3600); PT_DIE_IN_HANDLER=1 makes every
handler exit the process after Powertools saved its INPROGRESS record, as
a Lambda killed mid-invocation.
"""

import json
import os

from aws_lambda_powertools.utilities.idempotency import (
    DynamoDBPersistenceLayer,
    IdempotencyConfig,
    idempotent,
    idempotent_function,
)

EXPIRES = int(os.environ.get("PT_EXPIRES_AFTER", "3600"))


def persistence():
    """One persistence layer per handler: Powertools configures a layer once."""
    if os.environ.get("PT_REDIS_URL"):
        from aws_lambda_powertools.utilities.idempotency.persistence.redis import (
            RedisCachePersistenceLayer,
        )

        return RedisCachePersistenceLayer(url=os.environ["PT_REDIS_URL"])
    return DynamoDBPersistenceLayer(table_name=os.environ["PT_TABLE"])


def die_if_asked():
    if os.environ.get("PT_DIE_IN_HANDLER") == "1":
        os._exit(17)


def respond(event):
    die_if_asked()
    body = json.loads(event["body"])
    charge = {"charge": "ch_pt_" + str(body["order_id"]), "amount": body["amount"], "note": "réglé"}
    return {
        "statusCode": 201,
        "headers": {"Content-Type": "application/json", "X-Served-By": "powertools"},
        "body": json.dumps(charge),
    }


header_store = persistence()
header_config = IdempotencyConfig(
    event_key_jmespath='headers."Idempotency-Key"',
    payload_validation_jmespath="powertools_json(body)",
    expires_after_seconds=EXPIRES,
)


@idempotent(config=header_config, persistence_store=header_store)
def header_handler(event, context):
    return respond(event)


body_store = persistence()
body_config = IdempotencyConfig(
    event_key_jmespath="powertools_json(body).order_id",
    expires_after_seconds=EXPIRES,
)


@idempotent(config=body_config, persistence_store=body_store)
def body_handler(event, context):
    return respond(event)


sqs_store = persistence()
sqs_config = IdempotencyConfig(event_key_jmespath="messageId", expires_after_seconds=EXPIRES)


@idempotent_function(data_keyword_argument="record", config=sqs_config, persistence_store=sqs_store)
def process_record(record):
    die_if_asked()
    return {"receipt": json.loads(record["body"])["charge_id"]}


def sqs_handler(event, context):
    sqs_config.register_lambda_context(context)
    return [process_record(record=record) for record in event["Records"]]


raw_store = persistence()
raw_config = IdempotencyConfig(event_key_jmespath="body", expires_after_seconds=EXPIRES)


@idempotent(config=raw_config, persistence_store=raw_store)
def raw_handler(event, context):
    """Keyed on the body as the event carries it (base64 text, if so)."""
    die_if_asked()
    return {"statusCode": 201, "headers": {"X-Served-By": "powertools"}, "body": "raw " + event["body"][:12]}


plain_store = persistence()
plain_config = IdempotencyConfig(
    event_key_jmespath="powertools_json(body).order_id",
    expires_after_seconds=EXPIRES,
)


@idempotent(config=plain_config, persistence_store=plain_store)
def plain_handler(event, context):
    """An HTTP API (payload format 2.0) handler returning a plain dict:
    API Gateway serves it as 200 application/json."""
    die_if_asked()
    body = json.loads(event["body"])
    return {"charge": "ch_pt_" + str(body["order_id"]), "amount": body["amount"], "note": "réglé"}


unleased_store = persistence()
unleased_config = IdempotencyConfig(
    event_key_jmespath="powertools_json(body).order_id",
    expires_after_seconds=EXPIRES,
)


@idempotent_function(data_keyword_argument="event", config=unleased_config, persistence_store=unleased_store)
def charge_unleased(event):
    die_if_asked()
    return respond(event)


def unleased_handler(event, context):
    """Nothing registers the Lambda context (idempotent_function does not):
    Powertools writes its INPROGRESS record without in_progress_expiration."""
    return charge_unleased(event=event)


def sqs_unleased_handler(event, context):
    """process_record without sqs_config.register_lambda_context."""
    return [process_record(record=record) for record in event["Records"]]


query_store = persistence()
query_config = IdempotencyConfig(event_key_jmespath="queryStringParameters.order", expires_after_seconds=EXPIRES)


@idempotent(config=query_config, persistence_store=query_store)
def query_handler(event, context):
    """Keyed on a query string parameter, as API Gateway delivered it."""
    die_if_asked()
    order = event["queryStringParameters"]["order"]
    return {"statusCode": 201, "headers": {"X-Served-By": "powertools"}, "body": "query " + order}


text_store = persistence()
text_config = IdempotencyConfig(
    event_key_jmespath="powertools_json(body).order_id",
    expires_after_seconds=EXPIRES,
)


@idempotent(config=text_config, persistence_store=text_store)
def text_handler(event, context):
    """An HTTP API handler returning a plain string: API Gateway serves the
    string's text as a 200 application/json body; Powertools stores its
    json.dumps."""
    die_if_asked()
    return "charge ch_pt_" + str(json.loads(event["body"])["order_id"]) + ' "réglé"'


HANDLERS = {
    "header": header_handler,
    "body": body_handler,
    "sqs": sqs_handler,
    "raw": raw_handler,
    "plain": plain_handler,
    "unleased": unleased_handler,
    "sqs_unleased": sqs_unleased_handler,
    "query": query_handler,
    "text": text_handler,
}
STORES = {
    "header": header_store,
    "body": body_store,
    "sqs": sqs_store,
    "raw": raw_store,
    "plain": plain_store,
    "unleased": unleased_store,
    "sqs_unleased": sqs_store,
    "query": query_store,
    "text": text_store,
}
