// Micro-benchmark of the protocol sniffers: nanoseconds per parse of a first flight (ClientHello, HTTP
// request line + Host, DNS query). Run: `node bench/sniff.bench.ts [iterations]`. Prints a table; no assertions.
import net from 'node:net';
import tls from 'node:tls';
import { createSniffer } from '../src/trace/sniff/classify.ts';
import { DnsSniffer, parseDnsMessage } from '../src/trace/sniff/dns.ts';
import { Http1Sniffer } from '../src/trace/sniff/http1.ts';
import { parseClientHello, TlsSniffer } from '../src/trace/sniff/tls.ts';

const ITERATIONS = Number(process.argv[2] ?? 200_000);

/** The first record a real tls.connect sends, captured on loopback. */
async function captureClientHello(servername: string, alpn: string[]): Promise<Buffer> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as net.AddressInfo;
  try {
    return await new Promise<Buffer>((resolve) => {
      let got = Buffer.alloc(0);
      server.once('connection', (sock) => {
        sock.on('error', () => {});
        sock.on('data', (d: Buffer) => {
          got = Buffer.concat([got, d]);
          if (got.length >= 5 && got.length >= 5 + got.readUInt16BE(3)) {
            sock.destroy();
            resolve(got);
          }
        });
      });
      const client = tls.connect({ host: '127.0.0.1', port, servername, ALPNProtocols: alpn });
      client.on('error', () => {});
    });
  } finally {
    server.close();
  }
}

function dnsQuery(id: number, name: string): Buffer {
  const labels = name.split('.').map((l) => Buffer.concat([Buffer.from([l.length]), Buffer.from(l)]));
  return Buffer.concat([
    Buffer.from([id >> 8, id & 0xff, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]),
    ...labels,
    Buffer.from([0, 0, 1, 0, 1]),
  ]);
}

let sink = 0;

function bench(name: string, bytes: number, fn: () => unknown): { name: string; bytes: number; ns: number } {
  for (let i = 0; i < Math.min(20_000, ITERATIONS); i++) fn(); // warm up the JIT
  const start = process.hrtime.bigint();
  for (let i = 0; i < ITERATIONS; i++) if (fn() !== undefined) sink++;
  const ns = Number(process.hrtime.bigint() - start) / ITERATIONS;
  return { name, bytes, ns };
}

const hello = await captureClientHello('api.example.test', ['h2', 'http/1.1']);
const helloBody = hello.subarray(9, 5 + hello.readUInt16BE(3));
const request = Buffer.from(
  'GET /api/v1/items?limit=10 HTTP/1.1\r\nHost: items.default.svc.cluster.local\r\nUser-Agent: curl/8.5.0\r\n' +
    'Accept: */*\r\nAuthorization: Bearer abc.def.ghi\r\n\r\n',
);
const query = dnsQuery(0x1234, 'items.default.svc.cluster.local');
const response = Buffer.from(query);
response[2] = 0x81;
response[3] = 0x80;
const limits = { maxRequests: 16, keepCounting: true, onEvent: undefined };
const session = new DnsSniffer('udp', limits);
let id = 0;

const rows = [
  bench('TLS ClientHello: parseClientHello', hello.length, () => parseClientHello(helloBody).sni),
  bench('TLS ClientHello: new TlsSniffer + info()', hello.length, () => {
    const s = new TlsSniffer();
    s.onClientData(hello, 0);
    return s.info().sni;
  }),
  bench('TLS ClientHello: createSniffer (classify) + info()', hello.length, () => {
    const s = createSniffer({ protocol: 'tcp' });
    s.onClientData(hello, 0);
    return s.info().protocol;
  }),
  bench('HTTP/1 request line + Host: new Http1Sniffer', request.length, () => {
    const s = new Http1Sniffer(limits);
    s.onClientData(request, 0);
    return s;
  }),
  bench('HTTP/1 request: createSniffer (classify) + info()', request.length, () => {
    const s = createSniffer({ protocol: 'tcp' });
    s.onClientData(request, 0);
    return s.info().protocol;
  }),
  bench('DNS query: parseDnsMessage', query.length, () => parseDnsMessage(query)?.qname),
  bench('DNS query+response: UDP session sniffer, per pair', query.length + response.length, () => {
    id = (id + 1) & 0xffff;
    query.writeUInt16BE(id, 0);
    response.writeUInt16BE(id, 0);
    session.onClientData(query, 0);
    session.onEndpointData(response, 1);
    return session;
  }),
];

console.log(`sniffers, ${ITERATIONS} iterations each, node ${process.version}`);
console.log(`${'case'.padEnd(52)} ${'bytes'.padStart(6)} ${'ns/op'.padStart(8)}`);
for (const r of rows)
  console.log(`${r.name.padEnd(52)} ${String(r.bytes).padStart(6)} ${r.ns.toFixed(0).padStart(8)}`);
if (sink === -1) console.log(sink);
