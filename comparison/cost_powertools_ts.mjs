// Powertools for AWS Lambda (TypeScript, here as JavaScript on Node): one
// scenario of the cost benchmark (make bench-cost), the same requests as
// `bench_driver cost`. Environment as for cost_powertools_py.py; payload
// validation on, as there.
const { DynamoDBClient } = await import('@aws-sdk/client-dynamodb');
const { makeIdempotent, IdempotencyConfig } = await import('@aws-lambda-powertools/idempotency');
const { DynamoDBPersistenceLayer } = await import('@aws-lambda-powertools/idempotency/dynamodb');

const endpoint = process.env.BENCH_ENDPOINT;
const scenario = process.env.BENCH_COST_SCENARIO;
const n = Number(process.env.BENCH_N);
const bytes = Number(process.env.BENCH_RESPONSE_BYTES);
const run = process.env.BENCH_T0;

function hexPadding(length) {
  let seed = 7; let out = '';
  for (let i = 0; i < length; i++) {
    seed = (seed * 1103515245 + 12345) % 2147483648;
    out += '0123456789abcdef'[Math.floor(seed / 65536) & 15];
  }
  return out;
}
const padding = hexPadding(bytes);
const hold = new Map();

const client = new DynamoDBClient({
  endpoint, region: 'us-east-1', credentials: { accessKeyId: 'local', secretAccessKey: 'local' },
});
const persistenceStore = new DynamoDBPersistenceLayer({ tableName: process.env.BENCH_TABLE, awsSdkV3Client: client });
const charge = makeIdempotent(
  async (order) => {
    const held = hold.get(order.order_id);
    if (held) { held.entered(); await held.released; }
    const result = { id: `ch_${order.order_id}`, amount: order.amount, currency: order.currency, receipt: '' };
    result.receipt = padding.slice(0, Math.max(0, bytes - JSON.stringify(result).length));
    return result;
  },
  {
    persistenceStore,
    config: new IdempotencyConfig({
      eventKeyJmesPath: 'order_id', throwOnNoIdempotencyKey: true,
      payloadValidationJmesPath: '[amount, currency, customer]',
      useLocalCache: scenario === 'cached', maxLocalCacheSize: 4096,
    }),
  },
);

const order = (key, amount = 1250) => ({ order_id: key, amount, currency: 'EUR', customer: 'cus_42' });
const mark = async (label) => { await (await fetch(`${endpoint}/__mark/${label}`)).text(); };

const outcomes = {};
for (let i = 0; i < n; i++) {
  const key = `${scenario}-${i}-${run}`;
  let first = null; let release = null;
  if (['replay', 'cached', 'mismatch'].includes(scenario)) await charge(order(key));
  if (scenario === 'in-progress') {
    let entered;
    const inside = new Promise((resolve) => { entered = resolve; });
    const released = new Promise((resolve) => { release = resolve; });
    hold.set(key, { entered, released });
    first = charge(order(key));
    await inside;
  }
  await mark('start');
  let label;
  try {
    await charge(order(key, scenario === 'mismatch' ? 1251 : 1250));
    label = { new: 'fresh', replay: 'replay', cached: 'cached_replay' }[scenario] ?? 'ok';
  } catch (error) {
    label = error.name;
  }
  await mark('end');
  outcomes[label] = (outcomes[label] ?? 0) + 1;
  if (first) { release(); await first; }
}
console.log(JSON.stringify({ impl: 'powertools-typescript', scenario, requests: n, response_bytes: bytes, outcomes }));
