// Drives Agent Relay 1.x's local daemon for `fleetd-bench peers` with the package's own client
// (`dist/wrapper/client.js`, the one its wrappers use). Written into the benchmark's temp dir and
// run with node; prints one JSON line `{"samples_us": [...]}` on stdout.
//
// node agent_relay_driver.mjs deliver CLIENT_JS SOCKET ROUNDS WARMUP TEXT
//   a sender agent sends TEXT to a receiver agent connected to the same daemon; one sample is
//   the time from `sendMessage` to the receiver's `onMessage` (the daemon's DELIVER push).
// node agent_relay_driver.mjs wake CLIENT_JS SOCKET ROUNDS WARMUP TEXT TARGET LOG PACE_MS
//   TARGET is an idle agent wrapped by relay-pty (`agent-relay create-agent`) that appends
//   "<unix µs> <line>" to LOG for each line typed into it; one sample is the time from
//   `sendMessage` to the moment that agent read the injected line.
const [mode, clientJs, socketPath, roundsArg, warmupArg, text, target, logPath, paceArg] =
  process.argv.slice(2);
const { RelayClient } = await import(clientJs);
const fs = await import('node:fs');
// The client logs every delivery with console.log; stdout carries only the result line.
console.log = () => {};
const rounds = Number(roundsArg);
const warmup = Number(warmupArg);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const wallUs = () => Math.round((performance.timeOrigin + performance.now()) * 1000);

async function connect(agentName) {
  const client = new RelayClient({ socketPath, agentName, reconnect: false });
  await client.connect();
  return client;
}

function send(client, to, body) {
  if (!client.sendMessage(to, body)) throw new Error(`sendMessage to ${to} refused`);
}

async function deliver() {
  const lead = await connect('BenchLead');
  const member = await connect('BenchMember');
  let waiting = null;
  lead.onMessage = (_from, payload) => {
    if (waiting && payload.body === waiting.body) {
      const w = waiting;
      waiting = null;
      w.resolve(process.hrtime.bigint());
    }
  };
  const samples = [];
  for (let i = 0; i < warmup + rounds; i++) {
    const body = `${text} round=${i}.`;
    const got = new Promise((resolve, reject) => {
      waiting = { body, resolve };
      setTimeout(() => reject(new Error(`round ${i} was not delivered within 10 s`)), 10000).unref();
    });
    const start = process.hrtime.bigint();
    send(member, 'BenchLead', body);
    const end = await got;
    if (i >= warmup) samples.push(Number(end - start) / 1000);
    await sleep(5);
  }
  return samples;
}

// The time the wrapped agent logged for the line carrying `marker`, once it is there.
async function seen(marker, timeoutMs) {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    const text = fs.existsSync(logPath) ? fs.readFileSync(logPath, 'utf8') : '';
    const line = text.split('\n').find((l) => l.includes(marker));
    if (line) return Number(line.split(' ')[0]);
    await sleep(1);
  }
  return null;
}

async function wake() {
  const member = await connect('BenchWaker');
  const pace = Number(paceArg);
  // The wrapped agent registers with the daemon some time after it starts; a message sent to
  // an unknown name is dropped, so the first message is retried until one arrives.
  let registered = false;
  for (let attempt = 0; attempt < 12 && !registered; attempt++) {
    const marker = `register=${attempt}.`;
    send(member, target, `${text} ${marker}`);
    registered = (await seen(marker, 5000)) !== null;
  }
  if (!registered) throw new Error(`${target} never received a message (is it registered?)`);
  const samples = [];
  for (let i = 0; i < warmup + rounds; i++) {
    // Idle again: relay-pty waits for its idle timeout of silence before it types.
    await sleep(pace);
    const marker = `round=${i}.`;
    const start = wallUs();
    send(member, target, `${text} ${marker}`);
    const end = await seen(marker, 10000);
    if (end === null) throw new Error(`round ${i} never reached ${target}`);
    if (i >= warmup) samples.push(end - start);
  }
  return samples;
}

const samples = mode === 'wake' ? await wake() : await deliver();
process.stdout.write(JSON.stringify({ samples_us: samples }) + '\n');
process.exit(0);
