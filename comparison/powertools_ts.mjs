// Powertools for AWS Lambda (TypeScript, here as JavaScript on Node): the
// same workload as the other drivers. Environment as for powertools_py.py.
const T0 = BigInt(process.env.BENCH_T0);

const { DynamoDBClient } = await import('@aws-sdk/client-dynamodb');
const { makeIdempotent, IdempotencyConfig } = await import('@aws-lambda-powertools/idempotency');
const { DynamoDBPersistenceLayer } = await import('@aws-lambda-powertools/idempotency/dynamodb');

let calls = 0;
const client = new DynamoDBClient({
  endpoint: process.env.BENCH_ENDPOINT,
  region: 'us-east-1',
  credentials: { accessKeyId: 'local', secretAccessKey: 'local' },
});
client.middlewareStack.add((next) => async (args) => { calls += 1; return next(args); },
  { step: 'initialize', name: 'countCalls' });
const persistenceStore = new DynamoDBPersistenceLayer({ tableName: process.env.BENCH_TABLE, awsSdkV3Client: client });
const charge = makeIdempotent(
  async (order) => ({ id: `ch_${order.order_id}`, amount: order.amount, currency: order.currency }),
  { persistenceStore, config: new IdempotencyConfig({ eventKeyJmesPath: 'order_id', throwOnNoIdempotencyKey: true }) },
);

const order = (key) => ({ order_id: key, amount: 1250, currency: 'EUR', customer: 'cus_42' });
const now = () => process.hrtime.bigint();
async function timed(fn) { const start = now(); await fn(); return Number(now() - start) / 1e6; }
function summary(latencies, wallMs, callsMade, requests) {
  latencies.sort((a, b) => a - b);
  const mid = latencies.length / 2;
  const median = latencies.length % 2 ? latencies[Math.floor(mid)] : (latencies[mid - 1] + latencies[mid]) / 2;
  return {
    median_ms: median,
    p99_ms: latencies[Math.min(latencies.length - 1, Math.floor(latencies.length * 0.99))],
    throughput_rps: requests / (wallMs / 1000),
    calls_per_request: callsMade / requests,
  };
}

await charge(order('cold'));
const coldMs = Number(BigInt(Date.now()) * 1000000n - T0) / 1e6;
const n = Number(process.env.BENCH_N);
const results = {};
const keys = Array.from({ length: n }, (_, i) => `ts-new-${i}`);

for (const phase of ['new', 'replay']) {
  const before = calls; const start = now(); const lat = [];
  for (const k of keys) lat.push(await timed(() => charge(order(k))));
  results[phase] = summary(lat, Number(now() - start) / 1e6, calls - before, n);
}

const total = Number(process.env.BENCH_CONCURRENT); const clients = Number(process.env.BENCH_CLIENTS);
let seed = 7; const random = () => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed / 2147483648; };
const issued = [];
for (let i = 0; i < total; i++) issued.push(issued.length && random() < 0.1 ? issued[Math.floor(random() * issued.length)] : `ts-conc-${i}`);
const before = calls; const start = now(); const lat = []; let errors = 0; let next = 0;
await Promise.all(Array.from({ length: clients }, async () => {
  while (next < issued.length) {
    const key = issued[next++];
    try { lat.push(await timed(() => charge(order(key)))); } catch { errors += 1; }
  }
}));
results.concurrent = { ...summary(lat, Number(now() - start) / 1e6, calls - before, total), errors };
console.log(JSON.stringify({ impl: 'powertools-typescript', cold_start_ms: coldMs, results }));
