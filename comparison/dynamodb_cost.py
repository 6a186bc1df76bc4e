"""DynamoDB's capacity units for calls seen on the wire, by its published rules.

DynamoDB bills capacity units, not calls. DynamoDB Local reports
`ConsumedCapacity` for plain calls, but not the transactional doubling nor
the units of a refused conditional write, so the units are computed here
from what crossed the wire (the operation, the items before and after it,
whether its condition held) by the rules of the AWS DynamoDB Developer
Guide:

- "DynamoDB item sizes and formats"
  (https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/CapacityUnitCalculations.html):
  an item's size is the sum of its attribute names' UTF-8 lengths and its
  values' sizes: a string its UTF-8 length, a number about one byte per two
  significant digits plus one, a binary its raw length, a null or a Boolean
  one byte, a list or a map 3 bytes plus its elements plus one byte per
  element.
- "DynamoDB read and write operations"
  (https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/read-write-operations.html):
  a write costs one unit per started KB of the larger of the item before
  and after (PutItem, UpdateItem; DeleteItem the deleted item), a
  transactional write two; a refused conditional write still costs the
  units of the larger of the existing item and the one it tried to write;
  a strongly consistent read costs one unit per started 4 KB, an eventually
  consistent one half that, a transactional read two; a read of a missing
  item still costs its unit; a Query costs the total size of what it read,
  rounded up once.

Stdlib only. `python3 comparison/test_dynamodb_cost.py` tests it.
"""
import base64
import math

KB = 1024
READ_BLOCK = 4 * KB

# On-demand list prices, us-east-1, DynamoDB Standard table class, in US
# dollars per million request units. From 1 November 2024 (AWS halved the
# on-demand prices that day); checked on 2026-11-26 against a secondary
# source (airbyte.com, "Amazon DynamoDB Pricing: On-Demand & Provisioned
# Plans", July 2025): AWS's own pricing page
# (https://aws.amazon.com/dynamodb/pricing/on-demand/) could not be fetched
# from this machine. Override with BENCH_PRICE_WRU / BENCH_PRICE_RRU.
PRICE_PER_MILLION_WRU = 0.625
PRICE_PER_MILLION_RRU = 0.125
PRICE_DATE = "2026-11-26"
PRICE_SOURCE = ("us-east-1 on-demand list price, Standard table class, in force since 2024-11-01 "
                "(AWS pricing page not reachable here; figure from airbyte.com's DynamoDB pricing guide, "
                "July 2025)")


def number_size(text):
    """A number's size: one byte per two significant digits, plus one.
    Leading and trailing zeros are trimmed; the sign and the decimal point
    are not digits."""
    digits = text.strip().lstrip("+-")
    mantissa, _, _exponent = digits.lower().partition("e")
    significant = mantissa.replace(".", "").strip("0")
    if not significant:
        return 1
    return math.ceil(len(significant) / 2) + 1


def value_size(value):
    """The size of one attribute value, in DynamoDB's JSON wire form
    ({"S": "..."}, {"N": "12"}, {"B": "<base64>"}, ...)."""
    (kind, payload), = value.items()
    if kind == "S":
        return len(payload.encode("utf-8"))
    if kind == "N":
        return number_size(payload)
    if kind == "B":
        return len(base64.b64decode(payload))
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "SS":
        return sum(len(s.encode("utf-8")) for s in payload)
    if kind == "NS":
        return sum(number_size(n) for n in payload)
    if kind == "BS":
        return sum(len(base64.b64decode(b)) for b in payload)
    if kind == "L":
        return 3 + sum(value_size(v) + 1 for v in payload)
    if kind == "M":
        return 3 + sum(len(k.encode("utf-8")) + value_size(v) + 1 for k, v in payload.items())
    raise ValueError(f"unknown attribute type {kind}")


def item_size(item):
    """An item's size in bytes; a missing item (None) is 0."""
    if not item:
        return 0
    return sum(len(name.encode("utf-8")) + value_size(value) for name, value in item.items())


def write_units(*sizes):
    """Units of a standard write touching an item of these sizes (before,
    after, or the one a refused write tried to write): the larger, per
    started KB, at least one."""
    return max(1, math.ceil(max(sizes, default=0) / KB))


def read_units(size, consistent):
    """Units of a read of `size` bytes (a missing item still costs a unit)."""
    units = max(1, math.ceil(size / READ_BLOCK))
    return units if consistent else units / 2


def call_units(call):
    """(write units, read units) of one recorded call.

    `call` is what comparison/dynamodb_proxy.py records: `op`, `request`,
    `status`, `response`, and for writes `before` / `after`: the items each
    action touched, as they were before and after the call (lists, one per
    action, None for a missing item)."""
    op, request = call["op"], call["request"]
    before, after = call.get("before") or [], call.get("after") or []
    if op in ("PutItem", "UpdateItem", "DeleteItem"):
        old, new = before[0], after[0]
        if op == "PutItem":
            # Applied or refused, the larger of the existing item and the
            # one written (or that the refused write tried to write).
            return write_units(item_size(old), item_size(request["Item"])), 0
        if op == "DeleteItem":
            return write_units(item_size(old)), 0
        # UpdateItem: before and after; a refused one is charged the
        # existing item (what it would have written is not on the wire).
        return write_units(item_size(old), item_size(new)), 0
    if op == "TransactWriteItems":
        # Two units per KB per action, cancelled or not.
        wcu = 0
        for index, action in enumerate(request["TransactItems"]):
            (kind, body), = action.items()
            old = before[index] if index < len(before) else None
            new = after[index] if index < len(after) else None
            if kind == "Put":
                wcu += 2 * write_units(item_size(old), item_size(body["Item"]))
            elif kind == "Delete":
                wcu += 2 * write_units(item_size(old))
            else:  # Update, ConditionCheck
                wcu += 2 * write_units(item_size(old), item_size(new))
        return wcu, 0
    if op == "GetItem":
        item = (call.get("response") or {}).get("Item")
        return 0, read_units(item_size(item), bool(request.get("ConsistentRead")))
    if op == "TransactGetItems":
        items = [r.get("Item") for r in (call.get("response") or {}).get("Responses", [])]
        return 0, sum(2 * read_units(item_size(i), True) for i in items)
    if op in ("Query", "Scan"):
        items = (call.get("response") or {}).get("Items", [])
        return 0, read_units(sum(item_size(i) for i in items), bool(request.get("ConsistentRead")))
    # Control-plane calls (CreateTable, DescribeTable, ...) are not billed
    # per request unit.
    return 0, 0


def dollars_per_million(wcu, rcu, wru_price=PRICE_PER_MILLION_WRU, rru_price=PRICE_PER_MILLION_RRU):
    """The on-demand cost of a million requests costing `wcu` and `rcu`
    units each."""
    return wcu * wru_price + rcu * rru_price
