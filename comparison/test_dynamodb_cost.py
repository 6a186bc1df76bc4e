"""Tests of comparison/dynamodb_cost.py: the published rules by hand, and,
when DynamoDB Local is there (AWS_ENDPOINT_URL_DYNAMODB, as under
scripts/with-dynamodb-local), its own ConsumedCapacity for plain calls on
items of sizes at the unit boundaries.

    python3 comparison/test_dynamodb_cost.py
"""
import base64
import http.client
import json
import os
import sys
import time
import unittest
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dynamodb_cost as cost  # noqa: E402


def padded(total, key="k"):
    """An item {"id": key, "p": "x" * n} of exactly `total` bytes."""
    fixed = len("id") + len(key) + len("p")
    return {"id": {"S": key}, "p": {"S": "x" * (total - fixed)}}


class Rules(unittest.TestCase):
    def test_scalar_sizes(self):
        self.assertEqual(cost.item_size({"id": {"S": "abc"}}), 5)
        self.assertEqual(cost.item_size({"é": {"S": "é"}}), 4)  # UTF-8 bytes, name and value
        self.assertEqual(cost.item_size({"b": {"B": base64.b64encode(b"0123456789").decode()}}), 11)
        self.assertEqual(cost.item_size({"t": {"BOOL": True}, "n": {"NULL": True}}), 4)

    def test_number_sizes(self):
        self.assertEqual(cost.number_size("1250"), 3)  # 125: two bytes of digits, one more
        self.assertEqual(cost.number_size("1764000000"), 3)  # trailing zeros trimmed: 1764
        self.assertEqual(cost.number_size("-0.5"), 2)
        self.assertEqual(cost.number_size("0"), 1)
        self.assertEqual(cost.number_size("1764000000123"), 8)  # 13 digits

    def test_collections(self):
        # 3 bytes of overhead, one more per element, names inside maps.
        self.assertEqual(cost.value_size({"L": [{"S": "ab"}, {"N": "1"}]}), 3 + (2 + 1) + (2 + 1))
        self.assertEqual(cost.value_size({"M": {"k": {"S": "v"}}}), 3 + 1 + 1 + 1)
        self.assertEqual(cost.value_size({"M": {}}), 3)

    def test_write_units_round_up_per_kb(self):
        self.assertEqual(cost.write_units(1), 1)
        self.assertEqual(cost.write_units(1023), 1)
        self.assertEqual(cost.write_units(1024), 1)
        self.assertEqual(cost.write_units(1025), 2)
        self.assertEqual(cost.write_units(300, 2049), 3)  # the larger of before and after
        self.assertEqual(cost.write_units(0), 1)

    def test_read_units_round_up_per_4_kb(self):
        self.assertEqual(cost.read_units(0, True), 1)  # a missing item still costs
        self.assertEqual(cost.read_units(4095, True), 1)
        self.assertEqual(cost.read_units(4096, True), 1)
        self.assertEqual(cost.read_units(4097, True), 2)
        self.assertEqual(cost.read_units(4097, False), 1)
        self.assertEqual(cost.read_units(100, False), 0.5)

    def test_refused_put_costs_the_larger_item(self):
        existing = padded(5000)
        call = {"op": "PutItem", "request": {"Item": padded(300)}, "status": 400,
                "before": [existing], "after": [existing]}
        self.assertEqual(cost.call_units(call), (5, 0))

    def test_transactions_cost_two_units_per_kb_per_item(self):
        call = {"op": "TransactWriteItems", "status": 200,
                "request": {"TransactItems": [{"Put": {"Item": padded(1500)}},
                                              {"Update": {"Key": {"id": {"S": "b"}}}}]},
                "before": [None, padded(200, "b")], "after": [padded(1500), padded(900, "b")]}
        self.assertEqual(cost.call_units(call), (2 * 2 + 2 * 1, 0))

    def test_prices(self):
        self.assertAlmostEqual(cost.dollars_per_million(2, 0), 1.25)
        self.assertAlmostEqual(cost.dollars_per_million(0, 5), 0.625)


@unittest.skipUnless(os.environ.get("AWS_ENDPOINT_URL_DYNAMODB"), "no DynamoDB Local (scripts/with-dynamodb-local)")
class AgainstDynamoDBLocal(unittest.TestCase):
    """DynamoDB Local's ConsumedCapacity where it reports one: plain calls
    that succeed (not transactions, which it counts once, nor refused
    conditional writes, for which it reports nothing)."""

    @staticmethod
    def dynamodb(operation, payload):
        url = urllib.parse.urlparse(os.environ["AWS_ENDPOINT_URL_DYNAMODB"])
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
        try:
            conn.request("POST", "/", json.dumps(payload), {
                "Content-Type": "application/x-amz-json-1.0",
                "X-Amz-Target": f"DynamoDB_20120810.{operation}",
                "Authorization": "AWS4-HMAC-SHA256 Credential=local/20260101/us-east-1/dynamodb/aws4_request, "
                                 "SignedHeaders=host, Signature=0",
            })
            response = conn.getresponse()
            body = json.loads(response.read() or b"{}")
        finally:
            conn.close()
        if response.status != 200:
            raise RuntimeError(f"DynamoDB {operation}: {response.status} {body}")
        return body

    @classmethod
    def setUpClass(cls):
        dynamodb = cls.dynamodb
        cls.table = f"cost-check-{time.time_ns()}"
        dynamodb("CreateTable", {
            "TableName": cls.table,
            "AttributeDefinitions": [{"AttributeName": "id", "AttributeType": "S"}],
            "KeySchema": [{"AttributeName": "id", "KeyType": "HASH"}],
            "BillingMode": "PAY_PER_REQUEST",
        })

    def consumed(self, operation, payload):
        answer = self.dynamodb(operation, dict(payload, TableName=self.table, ReturnConsumedCapacity="TOTAL"))
        return answer["ConsumedCapacity"]["CapacityUnits"]

    def test_put_item_at_kb_boundaries(self):
        for total in (100, 1023, 1024, 1025, 2048, 2049, 16 * 1024, 16 * 1024 + 1):
            item = padded(total, f"put-{total}")
            self.assertEqual(cost.item_size(item), total)
            with self.subTest(total=total):
                self.assertEqual(self.consumed("PutItem", {"Item": item}), cost.write_units(total))

    def test_get_item_at_4_kb_boundaries(self):
        for total in (1024, 4095, 4096, 4097, 16 * 1024 + 300):
            item = padded(total, f"get-{total}")
            self.dynamodb("PutItem", {"TableName": self.table, "Item": item})
            for consistent in (True, False):
                with self.subTest(total=total, consistent=consistent):
                    self.assertEqual(
                        self.consumed("GetItem", {"Key": {"id": item["id"]}, "ConsistentRead": consistent}),
                        cost.read_units(total, consistent))

    def test_update_item_costs_the_larger_of_before_and_after(self):
        item = padded(1000, "update")
        self.dynamodb("PutItem", {"TableName": self.table, "Item": item})
        self.assertEqual(self.consumed("UpdateItem", {
            "Key": {"id": item["id"]}, "UpdateExpression": "SET q = :q",
            "ExpressionAttributeValues": {":q": {"S": "y" * 99}}}), cost.write_units(1000, 1100))
        self.assertEqual(self.consumed("UpdateItem", {
            "Key": {"id": item["id"]}, "UpdateExpression": "REMOVE q, p"}), cost.write_units(1100, 8))

    def test_numbers_and_binary_at_a_boundary(self):
        # 1,024 bytes with a number and a binary value in it, then one more.
        for extra, units in ((0, 1), (1, 2)):
            blob = b"\x00" * (1024 - len("id") - len("nb") - len("expiration") - 6 - len("r") + extra)
            item = {"id": {"S": "nb"}, "expiration": {"N": "1764000000123"},  # 13 digits: 8 bytes
                    "r": {"B": base64.b64encode(blob).decode()}}
            self.assertEqual(cost.item_size(item), 1024 + 2 + extra)
            with self.subTest(extra=extra):
                self.assertEqual(self.consumed("PutItem", {"Item": item}), cost.write_units(cost.item_size(item)))


if __name__ == "__main__":
    unittest.main()
