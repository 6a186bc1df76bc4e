// Has Powertools for AWS Lambda (TypeScript) write idempotency records
// through its own makeIdempotent handlers, for the compatibility test
// (tests/powertools_compat.rs):
//
//     node write_records_ts.mjs MANIFEST.json
//
// Environment: PT_TABLE and AWS_ENDPOINT_URL_DYNAMODB (DynamoDB Local), or
// PT_REDIS_URL (redis-server, through its CachePersistenceLayer);
// AWS_LAMBDA_FUNCTION_NAME (the records' key prefix). Each case is a REST
// API event whose body is the payload; both handlers complete it, and the
// manifest holds the events, the responses, what a retry answered and the
// record ids Powertools computed. Then: a retry whose body only adds
// __proto__ members (Powertools replays it), a handler with a keyPrefix
// wrapped in whitespace, HTTP API (payload format 2.0) handlers that
// return a plain string and null, and one request left in progress without
// in_progress_expiration (no Lambda context; the process killed inside the
// function). Powertools comes from comparison/'s
// node_modules (make test installs it).
import { createRequire } from 'node:module';
import { spawnSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { isDeepStrictEqual } from 'node:util';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const require = createRequire(join(ROOT, 'comparison', 'package.json'));
const load = (name) => import(pathToFileURL(require.resolve(name)).href);
const { makeIdempotent, IdempotencyConfig } = await load('@aws-lambda-powertools/idempotency');

let persistence;
let redis;
if (process.env.PT_REDIS_URL) {
  const { createClient } = await load('@redis/client');
  const { CachePersistenceLayer } = await load('@aws-lambda-powertools/idempotency/cache');
  redis = await createClient({ url: process.env.PT_REDIS_URL }).connect();
  persistence = () => new CachePersistenceLayer({ client: redis });
} else {
  const { DynamoDBClient } = await load('@aws-sdk/client-dynamodb');
  const { DynamoDBPersistenceLayer } = await load('@aws-lambda-powertools/idempotency/dynamodb');
  const client = new DynamoDBClient({
    endpoint: process.env.AWS_ENDPOINT_URL_DYNAMODB,
    region: 'us-east-1',
    credentials: { accessKeyId: 'local', secretAccessKey: 'local' },
  });
  persistence = () => new DynamoDBPersistenceLayer({ tableName: process.env.PT_TABLE, awsSdkV3Client: client });
}
const context = {
  functionName: process.env.AWS_LAMBDA_FUNCTION_NAME,
  awsRequestId: '00000000-0000-0000-0000-000000000000',
  getRemainingTimeInMillis: () => 600000,
};

const respond = async (event) => ({
  statusCode: 201,
  headers: { 'Content-Type': 'application/json', 'X-Served-By': 'powertools-ts' },
  body: JSON.stringify({ charge: `ch_ts_${event.body.length}`, note: 'réglé' }),
});
const stores = {};
const handler = (name, options, fn = respond, keyPrefix = undefined) => {
  stores[name] = persistence();
  return makeIdempotent(fn, { persistenceStore: stores[name], config: new IdempotencyConfig(options), keyPrefix });
};
// What Powertools trims (JavaScript's trim(): U+FEFF and U+2028 too).
const KEY_PREFIX = ' \ufeff pt-prefix \u2028\t';
const handlers = {
  // Keyed on the whole decoded body: every value's serialisation counts.
  body: handler('body', { eventKeyJmesPath: 'powertools_json(body)' }),
  // Keyed on a field, with payload validation over the body.
  field: handler('field', {
    eventKeyJmesPath: 'powertools_json(body).order_id',
    payloadValidationJmesPath: 'powertools_json(body)',
  }),
};
const byOrder = { eventKeyJmesPath: 'powertools_json(body).order_id' };
const others = {
  prefixed: handler('prefixed', byOrder, respond, KEY_PREFIX),
  // HTTP API handlers returning what is not a proxy response.
  text: handler('text', byOrder, async (event) => `charge ch_ts_${event.body.length} "réglé"`),
  nothing: handler('nothing', byOrder, async () => null),
};

// Payloads as a client sends them (JSON text): non-ASCII, escapes,
// integer-like keys and keys equal but for case, numbers JavaScript
// rewrites, nesting, a lone surrogate, a repeated key.
const payloads = [
  '{"order_id": "o-1", "amount": 1250, "note": "réglé €😀"}',
  '{"order_id": "o-2", "memo": "a\\"b\\\\c\\n\\t\\u0001\\u007f/\\/"}',
  '{"order_id": "o-3", "10": "ten", "9": "nine", "b": 1, "B": 2, "a": 3, "01": "x", "4294967295": 0}',
  '{"order_id": "o-4", "amount": 12.50, "rate": 1e21, "tiny": 1e-7, "neg": -0, "big": 123456789012345678901234567890, "f": 0.1, "e": 2E3}',
  '{"order_id": "o-5", "deep": {"z": [1, {"y": {"x": [[[]]]}}], "A": {}, "list": [{"b": 1, "a": 2}]}}',
  '{"order_id": "o-6", "lone": "x\\ud800y"}',
  '{"order_id": "o-7", "dup": 1, "other": true, "dup": 2}',
  '{"order_id": "o-8", "Émile": 1, "émile": 2, "zeta": null, "Zeta": false}',
  // __proto__ members, which deepSort leaves out: at the top and nested,
  // holding an object, an array, a string, a number and null.
  '{"order_id": "o-9", "__proto__": {"x": 1}, "a": {"__proto__": [1, 2], "b": 2}, "c": [{"__proto__": "s"}, {"__proto__": 5}, {"__proto__": null}]}',
  // Keys that lowercase beyond ASCII: accents, final sigma, İ, a lone
  // surrogate beside letters.
  '{"order_id": "o-10", "ΑΣ\\ud800": 1, "ασ\\ud800": 2, "ας\\ud800": 3, "Éz": 4, "éa": 5, "İx": 6, "ix": 7, "Z\\udc00": 8, "a\\udc00": 9, "Éb\\ud800": 10, "éa\\ud800": 11, "ΣB\\ud800": 12, "σa\\ud800": 13}',
  // Nesting past Python's limit, which JavaScript has not.
  `{"order_id": "o-11", "deep": ${'['.repeat(1500)}${']'.repeat(1500)}}`,
  `{"order_id": "o-12", "deep": ${'{"a":'.repeat(1200)}1${'}'.repeat(1200)}}`,
];

// Not called with a Lambda context, and none registered: Powertools writes
// its INPROGRESS record without in_progress_expiration. With
// PT_DIE_UNLEASED=1 the process exits inside it, as a Lambda killed
// mid-invocation, after reading the event from stdin.
stores.unleased = persistence();
const chargeUnleased = makeIdempotent(
  async (event) => {
    if (process.env.PT_DIE_UNLEASED === '1') {
      // The id Powertools (configured by now) saved the record under.
      writeFileSync(1, stores.unleased.getHashedIdempotencyKey(event));
      process.exit(17);
    }
    return respond(event);
  },
  {
    persistenceStore: stores.unleased,
    config: new IdempotencyConfig({ eventKeyJmesPath: 'powertools_json(body).order_id' }),
  }
);
if (process.env.PT_DIE_UNLEASED === '1') {
  await chargeUnleased(JSON.parse(readFileSync(0, 'utf8')));
  throw new Error('the unleased handler returned');
}

const read = (file) => JSON.parse(readFileSync(join(ROOT, 'events', file), 'utf8'));
const template = read('rest-api-create-charge.json');
const restEvent = (body) => {
  const event = structuredClone(template);
  delete event.headers['Idempotency-Key'];
  delete event.multiValueHeaders['Idempotency-Key'];
  event.body = body;
  return event;
};
const httpApiEvent = (body) => {
  const event = read('http-api-create-charge.json');
  for (const name of Object.keys(event.headers)) {
    if (name.toLowerCase() === 'idempotency-key') delete event.headers[name];
  }
  event.body = body;
  return event;
};

// Completes `event` with `name`'s handler, and retries it (or `retryEvent`,
// a request Powertools must answer as the same one).
const complete = async (name, run, event, retryEvent) => {
  const response = await run(event, context);
  let retry = 'replayed';
  try {
    const again = await run(retryEvent ?? event, context);
    if (!isDeepStrictEqual(again, response)) throw new Error(`${name}: replayed another response`);
  } catch (error) {
    // Its cache layer drops the validation hash on completion, then
    // refuses every retry, as Powertools Python's Redis layer does.
    if (error.name !== 'IdempotencyValidationError') throw error;
    retry = 'validation_error';
  }
  const id = stores[name].getHashedIdempotencyKey(event);
  if (retryEvent && stores[name].getHashedIdempotencyKey(retryEvent) !== id) {
    throw new Error(`${name}: the retry has another id`);
  }
  return { handler: name, event, response, powertools_retry: retry, powertools_id: id, retry_event: retryEvent };
};

const manifest = { cases: [] };
for (const [name, run] of Object.entries(handlers)) {
  for (const body of payloads) {
    manifest.cases.push(await complete(name, run, restEvent(body)));
  }
}
// Payload validation on: a retry that only adds __proto__ members has the
// same payload hash, and Powertools replays it.
manifest.cases.push(
  await complete(
    'field',
    handlers.field,
    restEvent('{"order_id": "o-13", "amount": 3}'),
    restEvent('{"__proto__": {"amount": 4}, "order_id": "o-13", "amount": 3}'),
  ),
);
manifest.cases.push(
  await complete(
    'field',
    handlers.field,
    restEvent('{"order_id": "o-14", "item": {"sku": "a"}}'),
    restEvent('{"order_id": "o-14", "item": {"__proto__": "x", "sku": "a"}}'),
  ),
);
manifest.cases.push({
  ...(await complete('prefixed', others.prefixed, restEvent('{"order_id": "o-15"}'))),
  key_prefix: KEY_PREFIX,
});
manifest.cases.push(await complete('text', others.text, httpApiEvent('{"order_id": "o-16"}')));
manifest.cases.push(await complete('nothing', others.nothing, httpApiEvent('{"order_id": "o-17"}')));
{
  const event = structuredClone(template);
  event.headers['Idempotency-Key'] = 'pt-ts-unleased';
  event.multiValueHeaders['Idempotency-Key'] = ['pt-ts-unleased'];
  event.body = '{"order_id": "o-ts-unleased", "amount": 3}';
  const child = spawnSync(process.execPath, [fileURLToPath(import.meta.url), process.argv[2]], {
    input: JSON.stringify(event),
    env: { ...process.env, PT_DIE_UNLEASED: '1' },
    stdio: ['pipe', 'pipe', 'inherit'],
  });
  if (child.status !== 17) throw new Error(`the killed handler exited ${child.status}`);
  manifest.unleased = { event, powertools_id: child.stdout.toString() };
}
writeFileSync(process.argv[2], JSON.stringify(manifest, null, 1));
if (redis) await redis.quit();
